// The residual topology of a configuration: which buffers each sublayer reads, normalises and
// adds to, and which parameters each depth read uses. This is the one place a residual mode's
// wiring is written; Model (model/model.hpp) and CudaModel (cuda/cuda_model.hpp) resolve the
// indices below to their own host or device buffers.
//
// Residual-stream buffers are named by index: kEmbedding for the token embedding, j >= 0 for the
// output of sublayer j (its partial sum after the write-back), n_sublayers + i - 1 for the output
// Y_i of the DenseFormer DWA after block i (1-based; Topology::dwa_stream), kNoStream for no buffer. Sublayers
// are numbered 0 .. 2*n_layers-1 (even: attention, odd: MLP); read j is sublayer j's depth read
// and read n_sublayers (Topology::final_read) the final one, before the final norm.
#pragma once

#include <vector>

#include "model/config.hpp"
#include "model/weights.hpp"

namespace attnres {

inline constexpr int kEmbedding = -1;
inline constexpr int kNoStream = -2;

inline bool is_attention(int sublayer) { return sublayer % 2 == 0; }
inline int layer_of(int sublayer) { return sublayer / 2; }

// Which buffers one depth read mixes (stream indices: kEmbedding or a sublayer's output), and
// how its routes are formed.
struct ReadPlan {
  std::vector<int> sources;
  int n_routes = 1;
  bool average = false;         // rd average: one input, the mean of both routes
  bool uniform_value = false;   // rd frozen: route 1 is uniform
  bool separate_value = false;  // rd decoupled / frozen: V reads its own input
};

// The depth-read plans of a configuration: one per sublayer, then the final read (none in prenorm).
std::vector<ReadPlan> make_read_plans(const ModelConfig& config);

// Consecutive depth reads lo..hi that share their first n_shared sources (the embedding and
// the completed blocks), none of which any sublayer from lo on writes: a backward that has run
// reads hi, hi-1, ..., lo may add all their shares of those sources' gradients at once, before
// sublayer lo-1's backward (issue #49; the CUDA backend's batched read backward).
struct ReadGroup {
  int lo = 0, hi = 0;
  int n_shared = 0;
};

// One DenseFormer DWA (baselines-spec §1.1): after block `block` (1-based), Y = sum_j alpha_j X_j
// over `sources` (stream indices of block outputs X_j: kEmbedding for X_0, sublayer 2j-1's output
// for X_j), written to stream `output`; its weights are the parameter dwa.{block}.alpha.
struct DwaPlan {
  int block = 0;
  std::vector<int> sources;
  int output = kNoStream;
};

// Delta AttnRes (docs/delta-gated-spec.md §1.1): the sources of sublayer j's read as stream
// indices, kEmbedding or i for the deltas of i's block summed up to sublayer i (delta: f_i alone):
// the embedding (from sublayer 1 on), the completed blocks and, with delta_block_partial (and for
// delta), the current block's partial sum; without it the released schedule, a block from the
// sublayer after the next block's first on. Sublayer 0 has none. The learned null source, when
// configured, precedes these (it is not a stream).
std::vector<int> delta_read_sources(const ModelConfig& config, int j);
// The parameters of sublayer j's Delta read are named "<delta_read_prefix(j)><tensor>"
// ("layers.{l}.attn_res." / "mlp_res."); its gate's first tensor is delta_gate_tensor(gate) (the
// logit, the factor or the matrix; nullptr: no gate), the vector gate's bias "gate.bias".
std::string delta_read_prefix(int j);
const char* delta_gate_tensor(kernels::DeltaGate gate);

class Topology {
 public:
  explicit Topology(const ModelConfig& config);

  int n_sublayers() const { return n_sublayers_; }
  // Whether sublayers (and the final norm) read the stream through depth reads; otherwise each
  // normalises input(j), the running sum.
  bool has_reads() const { return !plans_.empty(); }
  int final_read() const { return n_sublayers_; }
  const std::vector<ReadPlan>& reads() const { return plans_; }
  const ReadPlan& read(int r) const { return plans_.at(static_cast<std::size_t>(r)); }

  // Without depth reads: the stream entering sublayer j (j == n_sublayers: the final norm's input):
  // the previous sublayer's output, or, in front of a block that follows a DWA, the DWA's output.
  int input(int j) const;
  // DenseFormer's DWAs in block order (empty in other modes), and the one after the block that
  // sublayer j ends (null when j is an attention sublayer or its block has none).
  const std::vector<DwaPlan>& dwas() const { return dwas_; }
  const DwaPlan* dwa_ending_at(int j) const;
  int dwa_stream(int block) const { return n_sublayers_ + block - 1; }
  bool is_dwa_stream(int index) const { return index >= n_sublayers_; }
  // The buffer sublayer j's output is added to: the stream entering it (prenorm), or the partial
  // sum of the current block (AttnRes), which the first sublayer of a block starts afresh
  // (kNoStream).
  int write_base(int j) const;

  // The reads split into ReadGroups, from the final read down: a block's reads (the final read
  // joins the last block's), at most max_reads a group; n_shared >= 1 (the embedding). Empty
  // without reads.
  std::vector<ReadGroup> read_groups(int max_reads) const;

  // Most sources of any read (1 without reads), and whether any read gives V its own input.
  int max_sources() const { return max_sources_; }
  bool any_separate_value() const { return any_separate_value_; }

 private:
  int n_sublayers_;
  int sublayers_per_block_;
  std::vector<ReadPlan> plans_;
  std::vector<DwaPlan> dwas_;
  std::vector<int> dwa_of_block_;  // index into dwas_ per block 0..n_layers, or -1
  int max_sources_ = 1;
  bool any_separate_value_ = false;
};

// The parameters read r uses (r == n_sublayers: the final read), in the parameters or in their
// gradients (both are ModelWeights views). RD's separate value route carries the attention
// sublayer's input norm (value_norm).
template <class Real>
struct ReadParams {
  Real* query = nullptr;
  Real* value_query = nullptr;  // null: route 1 absent or uniform
  Real* key_norm = nullptr;
  Real* value_norm = nullptr;   // null unless the plan has a separate value route
};

template <class Real>
ReadParams<Real> read_params(const ModelWeights<Real>& w, const Topology& topology, int r) {
  if (r == topology.final_read()) return {w.final_query, nullptr, w.final_key_norm, nullptr};
  const LayerWeights<Real>& l = w.layers[static_cast<std::size_t>(layer_of(r))];
  if (!is_attention(r)) return {l.mlp_query, nullptr, l.mlp_key_norm, nullptr};
  const ReadPlan& plan = topology.read(r);
  return {l.attn_query, plan.uniform_value ? nullptr : l.attn_value_query, l.attn_key_norm,
          plan.separate_value ? l.attn_norm : nullptr};
}

// The RMSNorm weight in front of sublayer j (j == n_sublayers: the final norm).
template <class Real>
Real* input_norm(const ModelWeights<Real>& w, int n_sublayers, int j) {
  if (j == n_sublayers) return w.final_norm;
  const LayerWeights<Real>& l = w.layers[static_cast<std::size_t>(layer_of(j))];
  return is_attention(j) ? l.attn_norm : l.mlp_norm;
}

}  // namespace attnres
