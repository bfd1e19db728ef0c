// The n-stream trunk of hyper-connections (hc) and mHC (mhc), baselines-spec §3-4. The state is n
// residual streams per token ([n_tok, n, d], kernels/streams.hpp): the embedding replicated n
// times enters; in front of sublayer j its module reads the sublayer input h_j from the state
// H_j; the shared sublayer body (sublayers.cpp) gives y_j = f_j(RMSNorm_j(h_j)); the module writes
// H_{j+1} = alpha_r^T H_j + beta y_j; the exit sums (or averages) the streams for the final norm.
// The modules' coefficients are HC's (static A, B, or dynamic from each stream's RMSNorm) or
// mHC's (sigmoid, 2 sigmoid and Sinkhorn of the flattened state); they stay in Real, only the
// sublayer GEMMs follow the matmul precision.
//
// Saved per sublayer: the state H_j (n d per token), h_j, its norm and the body's activations, y_j
// and the module's per-token coefficients (none for static HC); the state gradients live in two
// buffers used in turn.
#include <algorithm>
#include <utility>

#include "kernels/hyper_connection.hpp"
#include "kernels/mhc.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/streams.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"

namespace attnres {

namespace k = kernels;

// baselines-spec §3.3 and §4.3: the forward FLOPs of one stream module, in every sublayer, and the
// exit's sum of the n streams; x3 for forward and backward.
double stream_residual_flops(const ModelConfig& c) {
  const double d = c.d_model, n = c.n_streams();
  const double module = c.residual == ResidualMode::hc
                            ? (c.hc_dynamic ? 4 * n * d * (n + 3) : 2 * n * d * (n + 2))
                            : 2 * n * d * (n * n + 2 * n) + 2 * n * n * d + 7 * n * d + 4 * n * n * c.mhc_sinkhorn_iters;
  return 3 * (c.n_sublayers() * module + 2 * (n - 1) * d);
}

namespace {

template <class Real>
k::HyperConnection<Real> hc_module(const ModelConfig& c, const StreamModuleWeights<Real>& w, const Real* streams,
                                   std::int64_t n_tok) {
  k::HyperConnection<Real> hc;
  hc.streams = streams;
  hc.n_tok = n_tok;
  hc.n = c.hc_n;
  hc.d = c.d_model;
  hc.eps = static_cast<Real>(c.norm_eps);
  hc.A = w.A;
  hc.B = w.B;
  if (c.hc_dynamic) {
    hc.w_alpha = w.w_alpha;
    hc.w_beta = w.w_beta;
    hc.s_alpha = w.s_alpha;
    hc.s_beta = w.s_beta;
    hc.norm = w.norm;
    hc.tanh = c.hc_tanh;
  }
  return hc;
}

template <class Real>
k::ManifoldHyperConnection<Real> mhc_module(const ModelConfig& c, const StreamModuleWeights<Real>& w,
                                            const Real* streams, std::int64_t n_tok) {
  k::ManifoldHyperConnection<Real> m;
  m.streams = streams;
  m.n_tok = n_tok;
  m.n = c.mhc_n;
  m.d = c.d_model;
  m.eps = static_cast<Real>(c.norm_eps);
  m.phi = w.phi;
  m.alpha = w.alpha;
  m.bias = w.bias;
  m.sinkhorn_iters = c.mhc_sinkhorn_iters;
  m.order = c.mhc_sinkhorn_order;
  m.pre_eps = static_cast<Real>(c.mhc_pre_eps);
  return m;
}

// The exit's scale: 1 for the sum of the streams, 1/n for their mean.
template <class Real>
Real readout_scale(const ModelConfig& c) {
  return c.stream_readout() == StreamReadout::mean ? Real(1) / static_cast<Real>(c.n_streams()) : Real(1);
}

}  // namespace

template <class Real>
k::StreamCoefficients<Real> Model<Real>::stream_coefficients(int j) const {
  const Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const StreamModuleWeights<Real>& mw = w_.stream_modules[static_cast<std::size_t>(j)];
  if (config_.residual == ResidualMode::hc) return k::hc_coefficients(hc_module(config_, mw, s.streams, n_tok_), s.coef);
  return k::mhc_coefficients(mhc_module(config_, mw, s.streams, n_tok_), s.coef);
}

template <class Real>
void Model<Real>::stream_weights(int sublayer, std::int64_t token, std::span<Real> coef) const {
  require(config_.uses_streams() && sublayer >= 0 && sublayer < topo_.n_sublayers(), "the model has no stream module ",
          sublayer);
  require(token >= 0 && token < n_tok_, "token index out of range");
  const int n = config_.n_streams();
  require(static_cast<int>(coef.size()) == k::stream_coefficient_count(n), "coefficient buffer has the wrong size");
  const k::StreamCoefficients<Real> c = stream_coefficients(sublayer);
  const Real* alpha = k::detail::alpha_of(c, token);
  const Real* beta = k::detail::beta_of(c, token);
  std::copy(alpha, alpha + n * (n + 1), coef.begin());
  std::copy(beta, beta + n, coef.begin() + n * (n + 1));
}

template <class Real>
const Real* Model<Real>::forward_streams(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, ns = config_.n_streams(), L = topo_.n_sublayers();
  const Real eps = static_cast<Real>(config_.norm_eps);
  Buffers& b = buf_;
  k::stream_expand(b.sub[0].streams, b.emb, n, ns, d);
  for (int j = 0; j < L; ++j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mw = w_.stream_modules[static_cast<std::size_t>(j)];
    if (config_.residual == ResidualMode::hc) {
      k::hc_forward(hc_module(config_, mw, s.streams, n), s.h, s.coef, s.stream_act, s.stream_rms, b.stream_scratch);
    } else {
      k::mhc_forward(mhc_module(config_, mw, s.streams, n), s.h, s.coef, s.stream_act, s.stream_rms);
    }
    SublayerActivations<Real>& a = bodies_.at(j);
    k::rmsnorm_forward(a.x, a.rstd, s.h, input_norm(w_, L, j), n, d, eps);
    if (is_attention(j)) {
      bodies_.attention_forward(j, a.x, a.x, a.x, s.out, false, pass);
    } else {
      bodies_.mlp_forward(j, a.x, s.out, false, pass);
    }
    Real* next = j + 1 < L ? b.sub[static_cast<std::size_t>(j + 1)].streams : b.streams_final;
    k::stream_write_forward(next, s.streams, stream_coefficients(j), s.out, n, ns, d);
  }
  k::stream_reduce(b.h_final, b.streams_final, n, ns, d, readout_scale<Real>(config_));
  return b.h_final;
}

template <class Real>
void Model<Real>::backward_streams(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, ns = config_.n_streams(), L = topo_.n_sublayers();
  Buffers& b = buf_;
  // b.dh holds the readout's gradient: every stream receives it (times the readout's scale).
  Real* dnext = b.dstreams[0];  // dL/dH_{j+1}
  Real* dcur = b.dstreams[1];   // dL/dH_j, written by sublayer j's module
  k::stream_expand(dnext, b.dh, n, ns, d, readout_scale<Real>(config_));
  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mw = w_.stream_modules[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mg = g_.stream_modules[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = bodies_.at(j);
    k::stream_write_backward(b.dy, b.dbeta, dnext, s.out, stream_coefficients(j), n, ns, d);
    if (is_attention(j)) {
      bodies_.attention_backward(j, b.dy, a.x, a.x, a.x, b.dx, b.dx, b.dx, pass);
    } else {
      bodies_.mlp_backward(j, b.dy, a.x, b.dx, pass);
    }
    k::rmsnorm_backward(b.dh, input_norm(g_, L, j), b.dx, s.h, input_norm(w_, L, j), a.rstd, n, d, b.reduce);
    if (config_.residual == ResidualMode::hc) {
      const k::HyperConnectionGrads<Real> gr{mg.A, mg.B, mg.w_alpha, mg.w_beta, mg.s_alpha, mg.s_beta, mg.norm};
      k::hc_backward(hc_module(config_, mw, s.streams, n), s.coef, s.stream_act, s.stream_rms, b.dh, dnext, b.dbeta, dcur,
                     gr, b.stream_scratch);
    } else {
      const k::ManifoldHyperConnectionGrads<Real> gr{mg.phi, mg.alpha, mg.bias};
      k::mhc_backward(mhc_module(config_, mw, s.streams, n), s.coef, s.stream_act, s.stream_rms, b.dh, dnext, b.dbeta, dcur,
                      gr, b.stream_scratch);
    }
    std::swap(dnext, dcur);
  }
  k::stream_reduce(b.demb, dnext, n, ns, d);  // the entry's copies: their gradients add up
}

#define ATTNRES_STREAM_TRUNK_INSTANTIATIONS(Real)                                                 \
  template k::StreamCoefficients<Real> Model<Real>::stream_coefficients(int) const;               \
  template void Model<Real>::stream_weights(int, std::int64_t, std::span<Real>) const;            \
  template const Real* Model<Real>::forward_streams(const Pass<Real>&);                           \
  template void Model<Real>::backward_streams(const Pass<Real>&);
ATTNRES_STREAM_TRUNK_INSTANTIATIONS(float)
ATTNRES_STREAM_TRUNK_INSTANTIATIONS(double)
#undef ATTNRES_STREAM_TRUNK_INSTANTIATIONS

}  // namespace attnres
