// The two sublayer bodies every residual mode shares: attention and the SwiGLU MLP, from their
// normalised inputs to their output, and back. How a mode forms those inputs (a running sum, depth
// reads, DWAs, MUDD's four streams, hyper-connection streams) and where it writes the output is
// the trunk's business (trunk.cpp and the mode's own trunk file).
#include <type_traits>

#include "kernels/attention.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "model/model.hpp"

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
std::optional<k::ValueResidual<Real>> Model<Real>::value_residual(int layer) const {
  if (!config_.value_residual || layer == 0) return std::nullopt;
  const auto lambdas =
      k::vres_lambdas<Real>(config_.vres_mode, w_.layers[static_cast<std::size_t>(layer)].vres_lambda,
                            static_cast<Real>(config_.vres_lambda1), static_cast<Real>(config_.vres_lambda2));
  k::ValueResidual<Real> vr;
  vr.v1 = buf_.sub[0].v;
  vr.vn = buf_.sub[static_cast<std::size_t>(2 * layer)].v;
  vr.n_tok = n_tok_;
  vr.d = config_.d_model;
  vr.lambda1 = lambdas[0];
  vr.lambda2 = lambdas[1];
  return vr;
}

template <class Real>
void Model<Real>::attention_forward(int j, const Real* xq, const Real* xk, const Real* xv, Real* out,
                                    bool accumulate, std::int64_t batch, int seq, KvCache<Real>* cache) {
  Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const int pos0 = cache != nullptr ? cache->length : 0;
  const k::AttentionShape shape{batch, seq, cache != nullptr ? cache->max_seq : seq, config_.n_heads,
                                config_.head_dim(), pos0};
  k::linear_forward(s.q, xq, lw.wq, n, d, d, false, precision_);
  k::linear_forward(s.k, xk, lw.wk, n, d, d, false, precision_);
  k::linear_forward(s.v, xv, lw.wv, n, d, d, false, precision_);
  k::rope_forward(s.q, n, seq, pos0, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin);
  k::rope_forward(s.k, n, seq, pos0, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin);
  const Real* v = s.v;  // the values attention uses: the raw ones, or the value residual's mix
  if (const auto vr = value_residual(layer_of(j))) {
    k::value_residual_forward(*vr, buf_.vmix);
    v = buf_.vmix;
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
void Model<Real>::attention_backward(int j, const Real* dout, const Real* xq, const Real* xk, const Real* xv,
                                     Real* dxq, Real* dxk, Real* dxv, std::int64_t batch, int seq) {
  Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
  Buffers& b = buf_;
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const k::AttentionShape shape{batch, seq, seq, config_.n_heads, config_.head_dim(), 0};
  k::linear_backward_weight(lg.wo, dout, s.att, n, d, d, precision_);
  k::linear_backward_input(b.datt, dout, lw.wo, n, d, d, false, precision_);
  const auto vr = value_residual(layer_of(j));
  if (vr) k::value_residual_forward(*vr, b.vmix);  // V' again, bit for bit
  attention_kernel_backward(precision_, b.dq, b.dk, b.dv, b.datt, s.q, s.k, vr ? b.vmix : s.v, s.att, s.lse, shape);
  if (vr) {
    // dv becomes the raw V's gradient; V_1's share waits in dv1 for the first layer.
    Real dlambda[2] = {0, 0};
    const bool learned = config_.vres_parameters() > 0;
    k::value_residual_backward(*vr, b.dv, b.dv, b.dv1, learned ? dlambda : nullptr, b.reduce);
    if (learned) k::vres_parameter_gradients(config_.vres_mode, dlambda[0], dlambda[1], lg.vres_lambda);
  } else if (j == 0 && b.dv1 != nullptr) {
    k::add_into(b.dv, b.dv1, n * d);
  }
  k::rope_backward(b.dq, n, seq, 0, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin);
  k::rope_backward(b.dk, n, seq, 0, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin);
  k::linear_backward_weight(lg.wq, b.dq, xq, n, d, d, precision_);
  k::linear_backward_weight(lg.wk, b.dk, xk, n, d, d, precision_);
  if (xv != nullptr) k::linear_backward_weight(lg.wv, b.dv, xv, n, d, d, precision_);
  k::linear_backward_input(dxq, b.dq, lw.wq, n, d, d, false, precision_);
  k::linear_backward_input(dxk, b.dk, lw.wk, n, d, d, dxk == dxq, precision_);
  k::linear_backward_input(dxv, b.dv, lw.wv, n, d, d, dxv == dxq || dxv == dxk, precision_);
}

template <class Real>
void Model<Real>::mlp_forward(int j, const Real* x, Real* out, bool accumulate) {
  Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
  k::linear_forward(s.gate, x, lw.w_gate, n, d, H, false, precision_);
  k::linear_forward(s.up, x, lw.w_up, n, d, H, false, precision_);
  k::swiglu_forward(s.act, s.gate, s.up, n * H);
  k::linear_forward(out, s.act, lw.w_down, n, H, d, accumulate, precision_);
}

template <class Real>
void Model<Real>::mlp_backward(int j, const Real* dout, const Real* x, Real* dx) {
  Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
  Buffers& b = buf_;
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
  k::linear_backward_weight(lg.w_down, dout, s.act, n, H, d, precision_);
  k::linear_backward_input(b.dact, dout, lw.w_down, n, H, d, false, precision_);
  k::swiglu_backward(b.dgate, b.dup, b.dact, s.gate, s.up, n * H);
  k::linear_backward_weight(lg.w_gate, b.dgate, x, n, d, H, precision_);
  k::linear_backward_weight(lg.w_up, b.dup, x, n, d, H, precision_);
  k::linear_backward_input(dx, b.dgate, lw.w_gate, n, d, H, false, precision_);
  k::linear_backward_input(dx, b.dup, lw.w_up, n, d, H, true, precision_);
}

// Explicit instantiations of the members defined here (model.cpp instantiates the class).
#define ATTNRES_SUBLAYER_INSTANTIATIONS(Real)                                                                    \
  template std::optional<k::ValueResidual<Real>> Model<Real>::value_residual(int) const;                       \
  template void Model<Real>::attention_forward(int, const Real*, const Real*, const Real*, Real*, bool,          \
                                               std::int64_t, int, KvCache<Real>*);                              \
  template void Model<Real>::attention_backward(int, const Real*, const Real*, const Real*, const Real*, Real*,  \
                                                Real*, Real*, std::int64_t, int);                               \
  template void Model<Real>::mlp_forward(int, const Real*, Real*, bool);                                        \
  template void Model<Real>::mlp_backward(int, const Real*, const Real*, Real*);
ATTNRES_SUBLAYER_INSTANTIATIONS(float)
ATTNRES_SUBLAYER_INSTANTIATIONS(double)
#undef ATTNRES_SUBLAYER_INSTANTIATIONS

}  // namespace attnres
