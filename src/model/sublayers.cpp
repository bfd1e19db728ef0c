// The sublayer bodies (sublayers.hpp): attention with the value residual, and the SwiGLU MLP.
#include "model/sublayers.hpp"

#include <algorithm>
#include <type_traits>

#include "kernels/attention.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "model/topology.hpp"

namespace attnres {

namespace k = kernels;

namespace {

// Attention in the model's matmul precision: bf16 models run the bf16 kernels (float only).
template <class Real>
void attention_kernel_forward(k::MatmulPrecision precision, Real* out, Real* lse, const Real* q, const Real* kk,
                              const Real* v, const k::AttentionShape& shape) {
  if constexpr (std::is_same_v<Real, float>)
    if (precision == k::MatmulPrecision::bf16) return k::attention_forward_bf16(out, lse, q, kk, v, shape);
  k::attention_forward(out, lse, q, kk, v, shape);
}

template <class Real>
void attention_kernel_backward(k::MatmulPrecision precision, Real* dq, Real* dk, Real* dv, const Real* dout,
                               const Real* q, const Real* kk, const Real* v, const Real* out, const Real* lse,
                               const k::AttentionShape& shape) {
  if constexpr (std::is_same_v<Real, float>)
    if (precision == k::MatmulPrecision::bf16)
      return k::attention_backward_bf16(dq, dk, dv, dout, q, kk, v, out, lse, shape);
  k::attention_backward(dq, dk, dv, dout, q, kk, v, out, lse, shape);
}

}  // namespace

template <class Real>
SublayerBodies<Real>::SublayerBodies(const ModelConfig& config, const ModelWeights<Real>& w, ModelWeights<Real>& g,
                                     bool with_grad)
    : config_(config), w_(w), g_(g), with_grad_(with_grad), act_(static_cast<std::size_t>(config.n_sublayers())) {}

template <class Real>
void SublayerBodies<Real>::carve(ArenaCarver<Real>& arena, std::int64_t bt) {
  auto take = [&](std::int64_t n) { return arena.take(n); };
  const std::int64_t d = config_.d_model, H = config_.mlp_hidden;
  for (int j = 0; j < config_.n_sublayers(); ++j) {
    SublayerActivations<Real>& s = at(j);
    s.x = take(bt * d);
    s.rstd = take(bt);
    if (is_attention(j)) {
      s.q = take(bt * d);
      s.k = take(bt * d);
      s.v = take(bt * d);
      s.att = take(bt * d);
      s.lse = take(bt * config_.n_heads);
    } else {
      s.gate = take(bt * H);
      s.up = take(bt * H);
      s.act = take(bt * H);
    }
  }
  const bool vres = config_.value_residual && config_.n_layers > 1;
  if (vres) vmix_ = take(bt * d);
  if (vres && with_grad_) dv1_ = take(bt * d);
  const int half = config_.head_dim() / 2;
  rope_cos_ = take(static_cast<std::int64_t>(config_.max_seq_len) * half);
  rope_sin_ = take(static_cast<std::int64_t>(config_.max_seq_len) * half);
  if (with_grad_) {
    for (Real** p : {&dq_, &dk_, &dv_, &datt_}) *p = take(bt * d);
    for (Real** p : {&dgate_, &dup_, &dact_}) *p = take(bt * H);
  }
  if (arena.base != nullptr)
    k::rope_tables(rope_cos_, rope_sin_, config_.max_seq_len, config_.head_dim(), config_.rope_theta);
}

template <class Real>
std::int64_t SublayerBodies<Real>::reduce_scratch(std::int64_t bt) const {
  return config_.value_residual ? k::value_residual_scratch_size(bt) : 0;
}

template <class Real>
void SublayerBodies<Real>::begin_backward(std::int64_t n_tok) {
  if (dv1_ != nullptr) k::zero(dv1_, n_tok * config_.d_model);
}

template <class Real>
std::optional<k::ValueResidual<Real>> SublayerBodies<Real>::value_residual(int layer, std::int64_t n_tok) const {
  if (!config_.value_residual || layer == 0) return std::nullopt;
  const auto lambdas =
      k::vres_lambdas<Real>(config_.vres_mode, w_.layers[static_cast<std::size_t>(layer)].vres_lambda,
                            static_cast<Real>(config_.vres_lambda1), static_cast<Real>(config_.vres_lambda2));
  k::ValueResidual<Real> vr;
  vr.v1 = at(0).v;
  vr.vn = at(2 * layer).v;
  vr.n_tok = n_tok;
  vr.d = config_.d_model;
  vr.lambda1 = lambdas[0];
  vr.lambda2 = lambdas[1];
  return vr;
}

template <class Real>
void SublayerBodies<Real>::attention_forward(int j, const Real* xq, const Real* xk, const Real* xv, Real* out,
                                             bool accumulate, const Pass<Real>& pass) {
  SublayerActivations<Real>& s = at(j);
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = pass.n_tok(), batch = pass.batch;
  const int seq = pass.seq;
  KvCache<Real>* cache = pass.cache;
  const int d = config_.d_model;
  const int pos0 = cache != nullptr ? cache->length : 0;
  const k::AttentionShape shape{batch, seq, cache != nullptr ? cache->max_seq : seq, config_.n_heads,
                                config_.head_dim(), pos0};
  k::linear_forward(s.q, xq, lw.wq, n, d, d, false, precision_);
  k::linear_forward(s.k, xk, lw.wk, n, d, d, false, precision_);
  k::linear_forward(s.v, xv, lw.wv, n, d, d, false, precision_);
  k::rope_forward(s.q, n, seq, pos0, config_.n_heads, config_.head_dim(), rope_cos_, rope_sin_);
  k::rope_forward(s.k, n, seq, pos0, config_.n_heads, config_.head_dim(), rope_cos_, rope_sin_);
  const Real* v = s.v;  // the values attention uses: the raw ones, or the value residual's mix
  if (const auto vr = value_residual(layer_of(j), n)) {
    k::value_residual_forward(*vr, vmix_);
    v = vmix_;
  }
  if (cache != nullptr) {
    Real* kc = cache->keys(layer_of(j));
    Real* vc = cache->values(layer_of(j));
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t dst = (b * cache->max_seq + pos0) * d, src = b * seq * d;
      k::copy(kc + dst, s.k + src, std::int64_t(seq) * d);
      k::copy(vc + dst, v + src, std::int64_t(seq) * d);
    }
    attention_kernel_forward(precision_, s.att, s.lse, s.q, kc, vc, shape);
  } else {
    attention_kernel_forward(precision_, s.att, s.lse, s.q, s.k, v, shape);
  }
  k::linear_forward(out, s.att, lw.wo, n, d, d, accumulate, precision_);
}

template <class Real>
void SublayerBodies<Real>::attention_backward(int j, const Real* dout, const Real* xq, const Real* xk, const Real* xv,
                                              Real* dxq, Real* dxk, Real* dxv, const Pass<Real>& pass) {
  const SublayerActivations<Real>& s = at(j);
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = pass.n_tok(), batch = pass.batch;
  const int seq = pass.seq;
  const int d = config_.d_model;
  const k::AttentionShape shape{batch, seq, seq, config_.n_heads, config_.head_dim(), 0};
  k::linear_backward_weight(lg.wo, dout, s.att, n, d, d, precision_);
  k::linear_backward_input(datt_, dout, lw.wo, n, d, d, false, precision_);
  const auto vr = value_residual(layer_of(j), n);
  if (vr) k::value_residual_forward(*vr, vmix_);  // V' again, bit for bit
  attention_kernel_backward(precision_, dq_, dk_, dv_, datt_, s.q, s.k, vr ? vmix_ : s.v, s.att, s.lse, shape);
  if (vr) {
    // dv becomes the raw V's gradient; V_1's share waits in dv1 for the first layer.
    Real dlambda[2] = {0, 0};
    const bool learned = config_.vres_parameters() > 0;
    k::value_residual_backward(*vr, dv_, dv_, dv1_, learned ? dlambda : nullptr, reduce_);
    if (learned) k::vres_parameter_gradients(config_.vres_mode, dlambda[0], dlambda[1], lg.vres_lambda);
  } else if (j == 0 && dv1_ != nullptr) {
    k::add_into(dv_, dv1_, n * d);
  }
  k::rope_backward(dq_, n, seq, 0, config_.n_heads, config_.head_dim(), rope_cos_, rope_sin_);
  k::rope_backward(dk_, n, seq, 0, config_.n_heads, config_.head_dim(), rope_cos_, rope_sin_);
  k::linear_backward_weight(lg.wq, dq_, xq, n, d, d, precision_);
  k::linear_backward_weight(lg.wk, dk_, xk, n, d, d, precision_);
  if (xv != nullptr) k::linear_backward_weight(lg.wv, dv_, xv, n, d, d, precision_);
  k::linear_backward_input(dxq, dq_, lw.wq, n, d, d, false, precision_);
  k::linear_backward_input(dxk, dk_, lw.wk, n, d, d, dxk == dxq, precision_);
  k::linear_backward_input(dxv, dv_, lw.wv, n, d, d, dxv == dxq || dxv == dxk, precision_);
}

template <class Real>
void SublayerBodies<Real>::attention_value_weight_backward(int j, const Real* xv, const Pass<Real>& pass) {
  const int d = config_.d_model;
  k::linear_backward_weight(g_.layers[static_cast<std::size_t>(layer_of(j))].wv, dv_, xv, pass.n_tok(), d, d,
                            precision_);
}

template <class Real>
void SublayerBodies<Real>::mlp_forward(int j, const Real* x, Real* out, bool accumulate, const Pass<Real>& pass) {
  SublayerActivations<Real>& s = at(j);
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = pass.n_tok();
  const int d = config_.d_model, H = config_.mlp_hidden;
  k::linear_forward(s.gate, x, lw.w_gate, n, d, H, false, precision_);
  k::linear_forward(s.up, x, lw.w_up, n, d, H, false, precision_);
  k::swiglu_forward(s.act, s.gate, s.up, n * H);
  k::linear_forward(out, s.act, lw.w_down, n, H, d, accumulate, precision_);
}

template <class Real>
void SublayerBodies<Real>::mlp_backward(int j, const Real* dout, const Real* x, Real* dx, const Pass<Real>& pass) {
  const SublayerActivations<Real>& s = at(j);
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = pass.n_tok();
  const int d = config_.d_model, H = config_.mlp_hidden;
  k::linear_backward_weight(lg.w_down, dout, s.act, n, H, d, precision_);
  k::linear_backward_input(dact_, dout, lw.w_down, n, H, d, false, precision_);
  k::swiglu_backward(dgate_, dup_, dact_, s.gate, s.up, n * H);
  k::linear_backward_weight(lg.w_gate, dgate_, x, n, d, H, precision_);
  k::linear_backward_weight(lg.w_up, dup_, x, n, d, H, precision_);
  k::linear_backward_input(dx, dgate_, lw.w_gate, n, d, H, false, precision_);
  k::linear_backward_input(dx, dup_, lw.w_up, n, d, H, true, precision_);
}

template class SublayerBodies<float>;
template class SublayerBodies<double>;

}  // namespace attnres
