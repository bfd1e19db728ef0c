// The trunk of a residual family: everything between the embedding and the final norm that a
// residual mode shapes. The model (model.hpp) owns the embedding, the sublayer bodies
// (sublayers.hpp), the final norm and the LM head; a trunk forms each sublayer's input from the
// residual state, runs the body, writes the output back into the state, and hands the final norm
// its input; its backward runs the same way down. One class per family, each in its own file with
// its buffers, its parameters, its FLOP term and its record (model/family.hpp), which registers it:
//   single_stream_trunk.cpp  prenorm, full, block, rd, denseformer (wiring: model/topology.hpp)
//   stream_trunk.cpp         hc, mhc
//   mudd_trunk.cpp           mudd
//   delta_trunk.cpp          delta, delta_block
//   gated_residual_trunk.cpp gr (no pre-norms, no final norm: its final mixer feeds the LM head)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/arena.hpp"
#include "model/config.hpp"
#include "model/diagnostics.hpp"
#include "model/param_layout.hpp"
#include "model/sublayers.hpp"
#include "model/topology.hpp"
#include "model/weights.hpp"

namespace attnres {

// The model's buffers a trunk works with, carved by the model for up to max tokens.
template <class Real>
struct TrunkBuffers {
  const Real* emb = nullptr;  // the token embedding of the pass [n_tok, d]: the trunk's input
  Real* demb = nullptr;       // its gradient, which the backward adds into (zeroed by the model)
  // Gradient scratch [max tokens, d]: when the backward starts dh holds the gradient of the final
  // norm's input; then both are the trunk's (dx: a sublayer body's input gradient, by convention).
  Real* dh = nullptr;
  Real* dx = nullptr;
  Real* reduce = nullptr;  // chunked reductions, sized for every user's *_scratch_size
};

// What the model lends its trunk. References into the model, which outlives the trunk.
template <class Real>
struct ModelParts {
  const ModelConfig& config;
  const ParamLayout& layout;
  const Topology& topology;
  std::span<Real> params;
  std::span<Real> grads;  // empty: the model keeps no gradients
  const ModelWeights<Real>& w;
  ModelWeights<Real>& g;
  SublayerBodies<Real>& bodies;
  const TrunkBuffers<Real>& buffers;  // filled when the model carves its arena, before the trunk's
};

template <class Real>
class Trunk : public DepthView {
 public:

  // Lays the trunk's own activations out for up to bt tokens (or only counts them: ArenaCarver).
  virtual void carve(ArenaCarver<Real>& arena, std::int64_t bt) = 0;
  // The chunked-reduction scratch its kernels need for bt tokens (TrunkBuffers::reduce).
  virtual std::int64_t reduce_scratch(std::int64_t bt) const = 0;
  // From the embedding to the final norm's input, which it returns: a buffer that holds it until
  // the next pass.
  virtual const Real* forward(const Pass<Real>& pass) = 0;
  // From the final norm input's gradient (TrunkBuffers::dh) down to the embedding's (demb), adding
  // into the parameter gradients on the way.
  virtual void backward(const Pass<Real>& pass) = 0;
};

// The trunk of parts.config's family (its record's factory).
template <class Real>
std::unique_ptr<Trunk<Real>> make_trunk(const ModelParts<Real>& parts);

// Where a family's parameters go in the layout, whose order is that of checkpoints' tensors and of
// the optimizer's sums: right after a layer's attention norm, at the end of a layer, after the
// last layer (before the final norm).
enum class ParamPlace : int { attention_norm, layer_end, after_layers };
void add_trunk_params(ParamLayout& layout, const ModelConfig& config, ParamPlace place, int layer);

// The connections a config's weights determine (model/diagnostics.hpp's static_connections), from
// the parameters laid out by `layout`.
std::vector<Connections> trunk_static_connections(const ModelConfig& config, const ParamLayout& layout,
                                                  std::span<const double> params);

// Connections fixed by the weights (DenseFormer's): a sum that needs no pass.
class StaticMixing final : public MixingSum {
 public:
  explicit StaticMixing(std::vector<Connections> connections) : connections_(std::move(connections)) {}
  bool needs_passes() const override { return false; }
  void add_pass() override {}
  std::vector<Connections> connections() const override { return connections_; }

 private:
  std::vector<Connections> connections_;
};

}  // namespace attnres
