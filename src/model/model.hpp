// The decoder-only Transformer in every residual mode of the spec, with an explicit
// forward and hand-written backward. Real is float for training, double for exact checks.
// The model owns the token embedding, the sublayer bodies (sublayers.hpp), the final norm and the
// LM head; its residual family's trunk (trunk.hpp) owns everything in between.
//
// Parameters and gradients live in flat buffers (ParamLayout); every activation lives in
// one arena sized up front for (max_batch, max_seq), so a step allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/precision.hpp"
#include "model/arena.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/param_layout.hpp"
#include "model/sublayers.hpp"
#include "model/topology.hpp"
#include "model/trunk.hpp"
#include "model/weights.hpp"
#include "util/huge_pages.hpp"

namespace attnres {

template <class Real>
class Model {
 public:
  Model(const ModelConfig& config, std::int64_t max_batch, int max_seq, bool with_grad);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  std::span<Real> params() { return params_; }
  std::span<const Real> params() const { return params_; }
  std::span<Real> grads() { return grads_; }
  std::span<const Real> grads() const { return grads_; }
  std::int64_t max_batch() const { return max_batch_; }
  int max_seq() const { return max_seq_; }

  // Precision of every Linear GEMM (Q, K, V, O, the SwiGLU matrices, the LM head): fp32 by
  // default; bf16 rounds the GEMM operands to bf16 and accumulates in fp32 (float models only:
  // an error for double), and runs attention's products in bf16 too (kernels/attention.hpp; fp32
  // softmax statistics). Weights, gradients and depth routing stay in Real.
  void set_matmul_precision(kernels::MatmulPrecision precision);
  kernels::MatmulPrecision matmul_precision() const { return precision_; }

  // tokens: [batch, seq+1]; position t of a row predicts token t+1. Returns the mean
  // next-token cross-entropy in nats.
  double forward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq);
  // As forward, and overwrites grads() with the gradient of the mean loss.
  double forward_backward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq);
  // Logits [batch, seq, vocab] for inputs [batch, seq].
  void logits(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, std::span<Real> out);
  // Appends inputs [batch, seq] at positions cache.length.. and writes the logits of each
  // row's last position into out [batch, vocab]. Earlier positions come from the cache.
  void decode(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, KvCache<Real>& cache,
              std::span<Real> out);

  // What the last forward pass mixed across depth, for a run's diagnostics (model/diagnostics.hpp).
  const DepthView& depth_view() const { return *trunk_; }
  // The residual wiring: which buffers each sublayer and depth read uses (model/topology.hpp).
  const Topology& topology() const { return topo_; }
  // Depth routing of the last forward pass, for diagnostics: alpha [n_sources] of read `read`
  // (numbered as in Topology), route `route`, one token (row-major index into the last
  // forward's batch*seq).
  void read_weights(int read, int route, std::int64_t token, std::span<Real> alpha) const;
  // MUDD: the mixing weights dw[way, 0..S-1] of DA module `da` (after block da) in the last
  // forward pass, for one token (as read_weights); static: its a.
  void mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const;
  // MUDD: the norms ‖X_j‖ (over d) of the S sources DA module `da` mixes in the last forward pass,
  // for one token: the block outputs X_0..X_{da+1}, or with mudd_prepost_norm the normalised X^_j
  // the DA reads instead. The routing diagnostic weighs |dw| by them (baselines-spec §6.5);
  // computed from the forward's buffers on each call, nothing is kept for it.
  void mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const;
  // hc, mhc: the stream coefficients of sublayer `sublayer`'s module in the last forward pass, for
  // one token (as read_weights), in the layout the forward saves (kernels/streams.hpp): alpha [n,
  // n+1] row-major, then beta [n]; static HC: its A and B.
  void stream_weights(int sublayer, std::int64_t token, std::span<Real> coef) const;

 private:
  void carve(ArenaCarver<Real>& arena);
  void set_inputs(std::span<const std::int32_t> tokens, std::int64_t batch, int seq, bool with_targets);
  // Embedding, the trunk, final norm (into x_final_; a family without one hands the LM head the
  // trunk's output); and back from the final norm's output gradient (dx_final_) to the embedding's.
  void forward_trunk(const Pass<Real>& pass);
  void backward_trunk(const Pass<Real>& pass);

  ModelConfig config_;
  ParamLayout layout_;
  std::int64_t max_batch_;
  int max_seq_;
  bool with_grad_;
  bool final_norm_;  // the family's record says whether the model has one (gr: no, model/family.hpp)
  Topology topo_;
  // The flat buffers and the arena a step sweeps, on huge pages where the kernel offers them.
  HugePageVector<Real> params_;
  HugePageVector<Real> grads_;
  ModelWeights<Real> w_;
  ModelWeights<Real> g_;
  HugePageVector<Real> arena_;
  SublayerBodies<Real> bodies_;
  TrunkBuffers<Real> trunk_buffers_;  // the embedding and the gradient scratch the trunk shares
  std::unique_ptr<Trunk<Real>> trunk_;
  // The model's own activations: the embedding (trunk_buffers_), the final norm's output and RMS
  // factors, its input in the last forward (a buffer of the trunk's), the LM head's chunk of
  // logits; with gradients the final norm's output gradient.
  Real *emb_ = nullptr, *x_final_ = nullptr, *rstd_final_ = nullptr, *ce_logits_ = nullptr, *dx_final_ = nullptr;
  const Real* final_input_ = nullptr;
  const Real* head_input_ = nullptr;  // the LM head's input in the last forward: x_final_, or the trunk's output
  std::vector<std::int32_t> inputs_;
  std::vector<std::int32_t> targets_;
  std::vector<double> ce_row_loss_;
  std::int64_t n_tok_ = 0;  // batch * seq of the last forward
  kernels::MatmulPrecision precision_ = kernels::MatmulPrecision::fp32;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace attnres
