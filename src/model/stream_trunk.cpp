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
#include <memory>
#include <utility>

#include "kernels/elementwise.hpp"
#include "kernels/hyper_connection.hpp"
#include "kernels/mhc.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/streams.hpp"
#include "model/family.hpp"
#include "model/model.hpp"
#include "model/stream_mixing.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

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

// HC module of sublayer j (baselines-spec §3.1, §6.2): the init that equals pre-norm, A_m = e_{j mod n},
// A_r = I, B = 1, W = 0, s = hc_scale_init; no decay on A, B and s, decay on the dynamic W.
void add_hyper_connection(ParamLayout& layout, const ModelConfig& c, int j) {
  const int n = c.hc_n, home = j % n;
  const std::int64_t d = c.d_model;
  const std::string p = "hc." + std::to_string(j) + ".";
  std::vector<double> A(static_cast<std::size_t>(n * (n + 1)), 0.0);
  for (int i = 0; i < n; ++i) {
    A[static_cast<std::size_t>(i * (n + 1))] = i == home ? 1.0 : 0.0;  // column 0: A_m
    A[static_cast<std::size_t>(i * (n + 1) + 1 + i)] = 1.0;           // columns 1..n: A_r = I
  }
  layout.add_fixed(p + "A", std::move(A), false, {n, n + 1});
  layout.add_fixed(p + "B", std::vector<double>(static_cast<std::size_t>(n), 1.0), false);
  if (!c.hc_dynamic) return;
  layout.add_fixed(p + "w_alpha", std::vector<double>(static_cast<std::size_t>((n + 1) * d), 0.0), true, {n + 1, d});
  layout.add_fixed(p + "w_beta", std::vector<double>(static_cast<std::size_t>(d), 0.0), true);
  layout.add_fixed(p + "s_alpha", {c.hc_scale_init}, false);
  layout.add_fixed(p + "s_beta", {c.hc_scale_init}, false);
  layout.add(p + "norm.weight", {d}, ParamKind::norm_weight);
}

// mHC module of sublayer j (baselines-spec §4.1, §6.2): phi [n(n+2), n d] ~ N(0, mhc_phi_std) from
// its own named stream, alpha = mhc_alpha_init, the bias by mhc_bias_init; decay on phi only.
void add_mhc(ParamLayout& layout, const ModelConfig& c, int j) {
  const int n = c.mhc_n, home = j % n, m = k::stream_coefficient_count(n);
  const std::string p = "mhc." + std::to_string(j) + ".";
  layout.add(p + "phi", {m, static_cast<std::int64_t>(n) * c.d_model}, ParamKind::matrix, c.mhc_phi_std);
  layout.add_fixed(p + "alpha", std::vector<double>(3, c.mhc_alpha_init), false);
  std::vector<double> b(static_cast<std::size_t>(m), 0.0);
  if (c.mhc_bias_init == MhcBiasInit::home_pm3) {
    for (int i = 0; i < n; ++i) b[static_cast<std::size_t>(i)] = i == home ? 3.0 : -3.0;  // pre; post stays 0
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k) b[static_cast<std::size_t>(2 * n + i * n + k)] = i == k ? 3.0 : -3.0;  // 6I - 3
  }
  layout.add_fixed(p + "b", std::move(b), false);
}

}  // namespace

// One module per sublayer, after the layers.
void add_stream_params(ParamLayout& layout, const ModelConfig& c, ParamPlace place, int) {
  if (place != ParamPlace::after_layers) return;
  for (int j = 0; j < c.n_sublayers(); ++j) {
    if (c.residual == ResidualMode::hc) add_hyper_connection(layout, c, j);
    if (c.residual == ResidualMode::mhc) add_mhc(layout, c, j);
  }
}

namespace {

// The exit's weight per stream: 1 for the sum of the streams, 1/n for their mean.
double readout_weight(const ModelConfig& c) {
  return c.stream_readout() == StreamReadout::mean ? 1.0 / c.n_streams() : 1.0;
}

}  // namespace

// Static HC's unfolded dense connections (HC-P eq. 27) from its coefficients A and B, exactly:
// they are every token's, so one token's unfolding is their mean.
std::vector<Connections> stream_static_connections(const ModelConfig& c, const ParamLayout& layout,
                                                   std::span<const double> params) {
  if (c.residual != ResidualMode::hc || c.hc_dynamic) return {};
  std::vector<double> coefficients;  // per sublayer A [n, n+1], then B: the model's layout
  for (int j = 0; j < c.n_sublayers(); ++j)
    for (const char* tensor : {".A", ".B"}) {
      const ParamInfo& p = layout.at("hc." + std::to_string(j) + tensor);
      coefficients.insert(coefficients.end(), params.begin() + p.offset, params.begin() + p.offset + p.numel);
    }
  UnfoldedConnections unfolded(c.hc_n, c.n_sublayers(), readout_weight(c));
  unfolded.add(coefficients);
  return {unfolded.mean("hc")};
}

namespace {

// The stream module in front of sublayer j: HC's A .. norm, or mHC's phi, alpha, bias (null where
// the variant has none), in the parameters or in their gradients.
template <class Real>
struct StreamModuleWeights {
  Real* A = nullptr;  // hc.{j}.A [n, n+1]
  Real* B = nullptr;
  Real* w_alpha = nullptr;  // dynamic HC: [n+1, d]
  Real* w_beta = nullptr;
  Real* s_alpha = nullptr;
  Real* s_beta = nullptr;
  Real* norm = nullptr;
  Real* phi = nullptr;  // mhc.{j}.phi [n(n+2), n d]
  Real* alpha = nullptr;
  Real* bias = nullptr;
};

template <class Real>
std::vector<StreamModuleWeights<Real>> bind_stream_modules(const ModelConfig& c, const ParamLayout& layout,
                                                           std::span<Real> flat) {
  std::vector<StreamModuleWeights<Real>> out;
  auto get = [&](const std::string& name) { return param_view(layout, flat, name); };
  for (int j = 0; j < c.n_sublayers(); ++j) {
    const std::string hc = "hc." + std::to_string(j) + ".", mhc = "mhc." + std::to_string(j) + ".";
    out.push_back({get(hc + "A"), get(hc + "B"), get(hc + "w_alpha"), get(hc + "w_beta"), get(hc + "s_alpha"),
                   get(hc + "s_beta"), get(hc + "norm.weight"), get(mhc + "phi"), get(mhc + "alpha"),
                   get(mhc + "b")});
  }
  return out;
}

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

template <class Real>
class StreamTrunk final : public Trunk<Real> {
 public:
  explicit StreamTrunk(const ModelParts<Real>& parts)
      : p_(parts),
        w_(bind_stream_modules(parts.config, parts.layout, parts.params)),
        g_(bind_stream_modules(parts.config, parts.layout, parts.grads)),
        sub_(static_cast<std::size_t>(parts.config.n_sublayers())) {}

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override {
    const ModelConfig& c = p_.config;
    const std::int64_t d = c.d_model, ns = c.n_streams(), m = k::stream_coefficient_count(c.n_streams());
    const bool hc = c.residual == ResidualMode::hc, with_grad = !p_.grads.empty();
    for (Sublayer& s : sub_) {
      s.streams = arena.take(bt * ns * d);
      s.h = arena.take(bt * d);
      if (!hc || c.hc_dynamic) {
        s.coef = arena.take(bt * m);
        s.act = arena.take(bt * m);
        s.rms = arena.take(hc ? bt * ns : bt);
      }
      s.y = arena.take(bt * d);
    }
    streams_final_ = arena.take(bt * ns * d);
    readout_ = arena.take(bt * d);
    scratch_ = arena.take(hc ? k::hc_scratch_size(bt, c.hc_n, c.d_model)
                             : k::mhc_scratch_size(bt, c.mhc_n, c.mhc_sinkhorn_iters));
    if (with_grad) {
      for (Real*& g : dstreams_) g = arena.take(bt * ns * d);
      dbeta_ = arena.take(bt * ns);
      dy_ = arena.take(bt * d);
    }
  }

  std::int64_t reduce_scratch(std::int64_t bt) const override {
    return k::rmsnorm_scratch_size(bt, p_.config.d_model);
  }

  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: the unfolded connections (averaged over tokens; static HC's from its weights)
  // and the Amax gains of every token's coefficients.
  std::unique_ptr<MixingSum> mixing_sum() const override;
  std::int64_t tokens() const override { return n_tok_; }

  // Model::stream_weights.
  void stream_weights(int sublayer, std::int64_t token, std::span<Real> coef) const;

 private:
  // What sublayer j keeps: the n-stream state entering it [bt, n, d], the module's read h (the
  // body's input), the body's output y, and the module's per-token coefficients for the backward:
  // coef [bt, n(n+2)], HC's tanh values or mHC's z (act, same size), and the RMS factors (HC: [bt,
  // n], mHC: [bt]); static HC keeps none of the last three.
  struct Sublayer {
    Real* streams = nullptr;
    Real* h = nullptr;
    Real* y = nullptr;
    Real *coef = nullptr, *act = nullptr, *rms = nullptr;
  };

  // The write coefficients of sublayer j's module: the ones its forward saved (static HC: A and B).
  k::StreamCoefficients<Real> stream_coefficients(int j) const;

  const ModelParts<Real> p_;
  std::vector<StreamModuleWeights<Real>> w_, g_;  // by sublayer
  std::vector<Sublayer> sub_;
  // The state after the last sublayer and its readout (the final norm's input), the modules'
  // scratch; in the backward the state gradients of two consecutive sublayers (used in turn), the
  // output weights' per-token gradient and the body output's gradient.
  Real *streams_final_ = nullptr, *readout_ = nullptr, *scratch_ = nullptr;
  Real* dstreams_[2] = {nullptr, nullptr};
  Real *dbeta_ = nullptr, *dy_ = nullptr;
  std::int64_t n_tok_ = 0;  // of the last forward pass
};

// The sums over the tokens of passes of one model's connections and gains, from every token's
// coefficients (model/stream_mixing.hpp); they allocate when made, not per token.
template <class Real>
class StreamMixingSum final : public MixingSum {
 public:
  StreamMixingSum(const StreamTrunk<Real>& trunk, const ModelConfig& c, std::vector<Connections> static_connections)
      : trunk_(trunk),
        n_(c.n_streams()),
        sublayers_(c.n_sublayers()),
        name_(c.residual == ResidualMode::mhc ? "mhc" : "hc"),
        static_(std::move(static_connections)),
        unfolded_(n_, sublayers_, readout_weight(c)),
        gain_(n_, sublayers_),
        coef_(static_cast<std::size_t>(k::stream_coefficient_count(n_))),
        token_(coef_.size() * static_cast<std::size_t>(sublayers_)) {}

  void add_pass() override {
    const std::size_t m = coef_.size();
    for (std::int64_t t = 0; t < trunk_.tokens(); ++t) {
      for (int j = 0; j < sublayers_; ++j) {
        trunk_.stream_weights(j, t, coef_);
        std::copy(coef_.begin(), coef_.end(), token_.begin() + static_cast<std::ptrdiff_t>(m * j));
      }
      if (static_.empty()) unfolded_.add(token_);
      gain_.add(token_);
    }
  }
  std::vector<Connections> connections() const override {
    return static_.empty() ? std::vector<Connections>{unfolded_.mean(name_)} : static_;
  }
  std::optional<AmaxGain> amax_gain() const override { return gain_.result(); }

 private:
  const StreamTrunk<Real>& trunk_;
  int n_, sublayers_;
  std::string name_;
  std::vector<Connections> static_;  // static HC's, exactly (every token has them)
  UnfoldedConnections unfolded_;
  AmaxGainSum gain_;
  std::vector<Real> coef_;      // one sublayer's of one token
  std::vector<double> token_;   // one token's, every sublayer's
};

template <class Real>
std::unique_ptr<MixingSum> StreamTrunk<Real>::mixing_sum() const {
  const std::vector<double> params(p_.params.begin(), p_.params.end());
  return std::make_unique<StreamMixingSum<Real>>(*this, p_.config,
                                                 stream_static_connections(p_.config, p_.layout, params));
}

template <class Real>
k::StreamCoefficients<Real> StreamTrunk<Real>::stream_coefficients(int j) const {
  const Sublayer& s = sub_[static_cast<std::size_t>(j)];
  const StreamModuleWeights<Real>& mw = w_[static_cast<std::size_t>(j)];
  if (p_.config.residual == ResidualMode::hc)
    return k::hc_coefficients(hc_module(p_.config, mw, s.streams, n_tok_), s.coef);
  return k::mhc_coefficients(mhc_module(p_.config, mw, s.streams, n_tok_), s.coef);
}

template <class Real>
void StreamTrunk<Real>::stream_weights(int sublayer, std::int64_t token, std::span<Real> coef) const {
  require(sublayer >= 0 && sublayer < p_.config.n_sublayers(), "the model has no stream module ", sublayer);
  require(token >= 0 && token < n_tok_, "token index out of range");
  const int n = p_.config.n_streams();
  require(static_cast<int>(coef.size()) == k::stream_coefficient_count(n), "coefficient buffer has the wrong size");
  const k::StreamCoefficients<Real> c = stream_coefficients(sublayer);
  const Real* alpha = k::detail::alpha_of(c, token);
  const Real* beta = k::detail::beta_of(c, token);
  std::copy(alpha, alpha + n * (n + 1), coef.begin());
  std::copy(beta, beta + n, coef.begin() + n * (n + 1));
}

template <class Real>
const Real* StreamTrunk<Real>::forward(const Pass<Real>& pass) {
  n_tok_ = pass.n_tok();
  const std::int64_t n = n_tok_;
  const ModelConfig& c = p_.config;
  const int d = c.d_model, ns = c.n_streams(), L = c.n_sublayers();
  const Real eps = static_cast<Real>(c.norm_eps);
  k::stream_expand(sub_[0].streams, p_.buffers.emb, n, ns, d);
  for (int j = 0; j < L; ++j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mw = w_[static_cast<std::size_t>(j)];
    if (c.residual == ResidualMode::hc) {
      k::hc_forward(hc_module(c, mw, s.streams, n), s.h, s.coef, s.act, s.rms, scratch_);
    } else {
      k::mhc_forward(mhc_module(c, mw, s.streams, n), s.h, s.coef, s.act, s.rms);
    }
    SublayerActivations<Real>& a = p_.bodies.at(j);
    k::rmsnorm_forward(a.x, a.rstd, s.h, input_norm(p_.w, L, j), n, d, eps);
    if (is_attention(j)) {
      p_.bodies.attention_forward(j, a.x, a.x, a.x, s.y, false, pass);
    } else {
      p_.bodies.mlp_forward(j, a.x, s.y, false, pass);
    }
    Real* next = j + 1 < L ? sub_[static_cast<std::size_t>(j + 1)].streams : streams_final_;
    k::stream_write_forward(next, s.streams, stream_coefficients(j), s.y, n, ns, d);
  }
  k::stream_reduce(readout_, streams_final_, n, ns, d, readout_scale<Real>(c));
  return readout_;
}

template <class Real>
void StreamTrunk<Real>::backward(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const ModelConfig& c = p_.config;
  const int d = c.d_model, ns = c.n_streams(), L = c.n_sublayers();
  const TrunkBuffers<Real>& b = p_.buffers;
  // b.dh holds the readout's gradient: every stream receives it (times the readout's scale).
  Real* dnext = dstreams_[0];  // dL/dH_{j+1}
  Real* dcur = dstreams_[1];   // dL/dH_j, written by sublayer j's module
  k::stream_expand(dnext, b.dh, n, ns, d, readout_scale<Real>(c));
  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mw = w_[static_cast<std::size_t>(j)];
    const StreamModuleWeights<Real>& mg = g_[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = p_.bodies.at(j);
    k::stream_write_backward(dy_, dbeta_, dnext, s.y, stream_coefficients(j), n, ns, d);
    if (is_attention(j)) {
      p_.bodies.attention_backward(j, dy_, a.x, a.x, a.x, b.dx, b.dx, b.dx, pass);
    } else {
      p_.bodies.mlp_backward(j, dy_, a.x, b.dx, pass);
    }
    k::rmsnorm_backward(b.dh, input_norm(p_.g, L, j), b.dx, s.h, input_norm(p_.w, L, j), a.rstd, n, d, b.reduce);
    if (c.residual == ResidualMode::hc) {
      const k::HyperConnectionGrads<Real> gr{mg.A, mg.B, mg.w_alpha, mg.w_beta, mg.s_alpha, mg.s_beta, mg.norm};
      k::hc_backward(hc_module(c, mw, s.streams, n), s.coef, s.act, s.rms, b.dh, dnext, dbeta_, dcur, gr, scratch_);
    } else {
      const k::ManifoldHyperConnectionGrads<Real> gr{mg.phi, mg.alpha, mg.bias};
      k::mhc_backward(mhc_module(c, mw, s.streams, n), s.coef, s.act, s.rms, b.dh, dnext, dbeta_, dcur, gr, scratch_);
    }
    std::swap(dnext, dcur);
  }
  k::stream_reduce(b.demb, dnext, n, ns, d);  // the entry's copies: their gradients add up
}

}  // namespace

template <class Real>
std::unique_ptr<Trunk<Real>> make_stream_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<StreamTrunk<Real>>(parts);
}

template <class Real>
void Model<Real>::stream_weights(int sublayer, std::int64_t token, std::span<Real> coef) const {
  const auto* trunk = dynamic_cast<const StreamTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no stream module ", sublayer);
  trunk->stream_weights(sublayer, token, coef);
}

#define ATTNRES_STREAM_TRUNK_INSTANTIATIONS(Real)                                          \
  template std::unique_ptr<Trunk<Real>> make_stream_trunk(const ModelParts<Real>&);        \
  template void Model<Real>::stream_weights(int, std::int64_t, std::span<Real>) const;
ATTNRES_STREAM_TRUNK_INSTANTIATIONS(float)
ATTNRES_STREAM_TRUNK_INSTANTIATIONS(double)
#undef ATTNRES_STREAM_TRUNK_INSTANTIATIONS

const ResidualFamily& stream_family() {
  using M = ModelConfig;
  using R = ResidualMode;
  // Hyper-connections unfolded (HC-P eq. 27), as hc's or mhc's connections.
  auto unfolded = [](const char* roles) {
    return std::string("Hyper-connections unfolded (HC-P eq. 27): row k is sublayer k's input (the last row the "
                       "final readout), column s > 0 the output of sublayer s - 1; each weight is B_j (prod A_r) "
                       "A_m^k") + roles + ".";
  };
  const std::string per_token = "Per token from that token's coefficients, then the mean over evaluation tokens "
                                "(static HC: the same for every token, computed from A and B).";
  static const ResidualFamily family = {
      .name = "n-stream",
      // CUDA (src/cuda/cuda_model_streams.cpp, issue #48): every option of both modes.
      .modes = {{R::hc, "hc", true, {.connections = true, .amax_gain = true}},
                {R::mhc, "mhc", true, {.connections = true, .amax_gain = true}}},
      .trunk_float = make_stream_trunk<float>,
      .trunk_double = make_stream_trunk<double>,
      .add_params = add_stream_params,
      .static_connections = stream_static_connections,
      .residual_flops = stream_residual_flops,
      .connections = {{"hc", ConnectionAxis::source, {unfolded(""), per_token}},
                      {"mhc", ConnectionAxis::source,
                       {unfolded(" with mHC's H_post, H_res^T and H_pre in those roles"), per_token}},
                      // result.json files of versions before the per-token connections
                      {"hc_static_part", ConnectionAxis::source,
                       {unfolded(""), "Dynamic HC: the static part A, B only, without the per-token terms s tanh(.)."}}},
      .arms = {{"hc", [](M& m) { m.residual = R::hc, m.hc_dynamic = true; }},  // hc_n etc. from the config
               {"hc-static", [](M& m) { m.residual = R::hc, m.hc_dynamic = false; }},
               {"mhc", [](M& m) { m.residual = R::mhc; }}},
  };
  return family;
}

}  // namespace attnres
