// The two sublayer bodies every residual family shares: attention (with ResFormer's value residual)
// and the SwiGLU MLP, from their normalised inputs to their output, and back, with the activations
// they keep for the backward. How a family forms those inputs (a running sum, depth reads, DWAs,
// MUDD's four streams, hyper-connection streams) and where the output goes is its trunk's business
// (model/trunk.hpp); the body only writes (or adds) it where it is told.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/precision.hpp"
#include "kernels/value_residual.hpp"
#include "model/arena.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/weights.hpp"

namespace attnres {

// One pass over a batch of `batch` rows of `seq` tokens; when decoding, the KV cache it appends to
// (its positions start at cache->length).
template <class Real>
struct Pass {
  std::int64_t batch = 0;
  int seq = 0;
  KvCache<Real>* cache = nullptr;
  std::int64_t n_tok() const { return batch * seq; }
};

// What sublayer j keeps of the last forward pass. The trunk writes x and rstd (its pre-norm of the
// sublayer's input); the body the rest.
template <class Real>
struct SublayerActivations {
  Real* x = nullptr;     // the normalised input (attention: Q's, and K's and V's unless given apart)
  Real* rstd = nullptr;  // its RMS factors
  Real *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *lse = nullptr;  // attention
  Real *gate = nullptr, *up = nullptr, *act = nullptr;                             // MLP
};

template <class Real>
class SublayerBodies {
 public:
  // w and g: the model's weights and their gradients (g unused without gradients).
  SublayerBodies(const ModelConfig& config, const ModelWeights<Real>& w, ModelWeights<Real>& g, bool with_grad);

  // Lays the activations out for up to bt tokens (ArenaCarver: or only counts them); then the RoPE
  // tables are filled.
  void carve(ArenaCarver<Real>& arena, std::int64_t bt);
  // The chunked-reduction scratch the backward needs (the value residual's), and where it is: the
  // model's buffer, shared with the trunk.
  std::int64_t reduce_scratch(std::int64_t bt) const;
  void set_reduce(Real* reduce) { reduce_ = reduce; }
  void set_precision(kernels::MatmulPrecision precision) { precision_ = precision; }

  SublayerActivations<Real>& at(int j) { return act_[static_cast<std::size_t>(j)]; }
  const SublayerActivations<Real>& at(int j) const { return act_[static_cast<std::size_t>(j)]; }

  // Before a backward pass: zeroes the gradient the value residual sums over layers.
  void begin_backward(std::int64_t n_tok);

  // Attention of sublayer j (even) takes Q, K and V from xq, xk and xv (one buffer in most modes)
  // and writes its output to out (adds it with accumulate). Its backward overwrites dxq and
  // accumulates into dxk and dxv where they alias an earlier one; the weight gradients accumulate.
  // xv == nullptr: Wv's gradient is left to the caller (RD recomputes its value input later).
  void attention_forward(int j, const Real* xq, const Real* xk, const Real* xv, Real* out, bool accumulate,
                         const Pass<Real>& pass);
  void attention_backward(int j, const Real* dout, const Real* xq, const Real* xk, const Real* xv, Real* dxq,
                          Real* dxk, Real* dxv, const Pass<Real>& pass);
  // After attention_backward with xv == nullptr, before the next body's backward: Wv's gradient
  // from the value input, once the caller has it again (RD's value route recomputes it).
  void attention_value_weight_backward(int j, const Real* xv, const Pass<Real>& pass);
  // The MLP of sublayer j (odd), as attention with one input.
  void mlp_forward(int j, const Real* x, Real* out, bool accumulate, const Pass<Real>& pass);
  void mlp_backward(int j, const Real* dout, const Real* x, Real* dx, const Pass<Real>& pass);

 private:
  // The value residual of attention layer `layer` (null when it has none): V' from V_1 and its raw V.
  std::optional<kernels::ValueResidual<Real>> value_residual(int layer, std::int64_t n_tok) const;

  const ModelConfig& config_;
  const ModelWeights<Real>& w_;
  ModelWeights<Real>& g_;
  bool with_grad_;
  kernels::MatmulPrecision precision_ = kernels::MatmulPrecision::fp32;
  std::vector<SublayerActivations<Real>> act_;
  // The value residual: the mixed values V' of the current attention layer (recomputed in the
  // backward from V_1 and the layer's raw V, which are kept), and dL/dV_1 summed over layers.
  Real* vmix_ = nullptr;
  Real* dv1_ = nullptr;
  // Gradient scratch of the bodies' insides, shared by all sublayers.
  Real *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *datt_ = nullptr;
  Real *dgate_ = nullptr, *dup_ = nullptr, *dact_ = nullptr;
  Real *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  Real* reduce_ = nullptr;
};

extern template class SublayerBodies<float>;
extern template class SublayerBodies<double>;

}  // namespace attnres
