// The trunk of the Gated Residual (gr, docs/delta-gated-spec.md §2). The state is n branches per
// token ([n_tok, n, d], like the hyper-connection streams): the embedding enters every branch; in
// front of sublayer j its module's read (kernels/gated_residual) forms the sublayer input x_j, a
// gated mean of the normalised branches that replaces the sublayer's pre-norm; the shared body
// (sublayers.cpp) gives y_j; the write adds beta_i y_j to branch i (no mixing between branches).
// The final mixer, a read without a write, gives the LM head its input: the family has no
// pre-norms and no final norm (its record's model_norms = false).
//
// Its own trunk rather than a case of stream_trunk.cpp: HC and mHC share a pre-norm per sublayer,
// a mixing write and a summed exit into the final norm, none of which GR has; GR shares with them
// only the state's layout and its entry (kernels/streams.hpp's stream_expand and stream_reduce).
//
// Saved per sublayer: the state H_j (n d per token), the module's per-token values (branch RMS
// factors, W_down's output, the write gates, the read gates' channel means) and the body output y_j;
// the normalised branches and the read gates are recomputed in the backward (spec §2.4 "Save").
// The state gradient lives in one buffer: the write backward reads dL/dH_{j+1}, the read backward
// adds the module's part into it in place (H_{j+1} = H_j + beta y_j: the residual path is the identity).
#include <memory>
#include <string>

#include "kernels/elementwise.hpp"
#include "kernels/gated_residual.hpp"
#include "kernels/streams.hpp"
#include "model/family.hpp"
#include "model/model.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

// Spec §2.6: per sublayer module 4 n d r (W_down and W_up) + 2 n² d (W_inject) + 8 n d (norms, gated
// mean, write), the final mixer 4 n d r + 6 n d; x3 for forward and backward. (The spec's S figure,
// 23,033,664 forward, is net of the pre-norms and the final norm GR drops, 33 x 3d; the bench counts
// no norms, so the family term is the modules' own count.)
double gated_residual_flops(const ModelConfig& c) {
  const double d = c.d_model, n = c.gr_n, r = c.gr_bottleneck();
  const double module = 4 * n * d * r + 2 * n * n * d + 8 * n * d;
  const double mixer = 4 * n * d * r + 6 * n * d;
  return 3 * (c.n_sublayers() * module + mixer);
}

namespace {

// One module's parameters: gr.{j}.* (the final mixer: gr_final.*, without w_inject). Spec §2.3:
// the matrices ~ N(0, 0.02) from their own named streams, decayed; the zero-centred norm weight 0,
// decayed only with gr_decay_norm.
void add_module(ParamLayout& layout, const ModelConfig& c, const std::string& p, bool write) {
  const std::int64_t nd = static_cast<std::int64_t>(c.gr_n) * c.d_model, r = c.gr_bottleneck();
  constexpr double kStd = 0.02;
  layout.add_fixed(p + "norm.weight", std::vector<double>(static_cast<std::size_t>(nd), 0.0), c.gr_decay_norm);
  layout.add(p + "w_down", {r, nd}, ParamKind::matrix, kStd);
  layout.add(p + "w_up", {nd, r}, ParamKind::matrix, kStd);
  if (write) layout.add(p + "w_inject", {c.gr_n, nd}, ParamKind::matrix, kStd);
}

}  // namespace

// One module per sublayer after the layers (spec §2.7 order), then the final mixer.
void add_gated_residual_params(ParamLayout& layout, const ModelConfig& c, ParamPlace place, int) {
  if (place != ParamPlace::after_layers) return;
  for (int j = 0; j < c.n_sublayers(); ++j) add_module(layout, c, "gr." + std::to_string(j) + ".", true);
  add_module(layout, c, "gr_final.", false);
}

namespace {

template <class Real>
struct ModuleWeights {
  Real *norm = nullptr, *w_down = nullptr, *w_up = nullptr, *w_inject = nullptr;
};

// Modules 0..L-1, then the final mixer (index L), in the parameters or in their gradients.
template <class Real>
std::vector<ModuleWeights<Real>> bind_modules(const ModelConfig& c, const ParamLayout& layout, std::span<Real> flat) {
  std::vector<ModuleWeights<Real>> out;
  auto get = [&](const std::string& name) { return param_view(layout, flat, name); };
  for (int j = 0; j <= c.n_sublayers(); ++j) {
    const std::string p = j < c.n_sublayers() ? "gr." + std::to_string(j) + "." : std::string("gr_final.");
    out.push_back({get(p + "norm.weight"), get(p + "w_down"), get(p + "w_up"), get(p + "w_inject")});
  }
  return out;
}

template <class Real>
class GatedResidualTrunk final : public Trunk<Real> {
 public:
  explicit GatedResidualTrunk(const ModelParts<Real>& parts)
      : p_(parts),
        w_(bind_modules(parts.config, parts.layout, parts.params)),
        g_(bind_modules(parts.config, parts.layout, parts.grads)),
        mod_(static_cast<std::size_t>(parts.config.n_sublayers() + 1)) {}

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override {
    const ModelConfig& c = p_.config;
    const std::int64_t d = c.d_model, n = c.gr_n, r = c.gr_bottleneck();
    const int L = c.n_sublayers();
    for (int j = 0; j <= L; ++j) {
      Module& m = mod_[static_cast<std::size_t>(j)];
      m.H = arena.take(bt * n * d);
      m.saved.rms = arena.take(bt * n);
      m.saved.p = arena.take(bt * r);
      m.saved.gate_mean = arena.take(bt * n);
      if (j < L) {
        m.saved.beta = arena.take(bt * n);
        m.y = arena.take(bt * d);
      }
    }
    out_ = arena.take(bt * d);
    scratch_ = arena.take(k::gr_scratch_size(bt, c.gr_n, c.d_model, c.gr_bottleneck()));
    if (!p_.grads.empty()) {
      dH_ = arena.take(bt * n * d);
      dy_ = arena.take(bt * d);
      ds_ = arena.take(bt * n);
    }
  }

  std::int64_t reduce_scratch(std::int64_t) const override { return 0; }  // the kernels' own scratch

  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: the read and write gates per branch, averaged over tokens.
  std::unique_ptr<MixingSum> mixing_sum() const override;
  std::int64_t tokens() const override { return n_tok_; }

  // Module j's (j = L: the final mixer's) read gates' channel means [n] and, for j < L, its write
  // gates [n], for one token of the last forward pass.
  const Real* read_gates(int j, std::int64_t token) const {
    return mod_[static_cast<std::size_t>(j)].saved.gate_mean + token * p_.config.gr_n;
  }
  const Real* write_gates(int j, std::int64_t token) const {
    return mod_[static_cast<std::size_t>(j)].saved.beta + token * p_.config.gr_n;
  }

 private:
  // What module j keeps: the state entering it, its per-token values, the body output (sublayers only).
  struct Module {
    Real* H = nullptr;
    k::GatedResidualSaved<Real> saved;
    Real* y = nullptr;
  };

  k::GatedResidual<Real> module(int j) const {
    const ModelConfig& c = p_.config;
    const ModuleWeights<Real>& w = w_[static_cast<std::size_t>(j)];
    return {mod_[static_cast<std::size_t>(j)].H, n_tok_, c.gr_n, c.d_model, c.gr_bottleneck(),
            static_cast<Real>(c.norm_eps), w.norm, w.w_down, w.w_up, w.w_inject};
  }

  const ModelParts<Real> p_;
  std::vector<ModuleWeights<Real>> w_, g_;  // by module
  std::vector<Module> mod_;                 // by module
  // The final mixer's output (the LM head's input), the kernels' scratch; in the backward the state
  // gradient, the body output's and the write gates' pre-sigmoid gradients.
  Real *out_ = nullptr, *scratch_ = nullptr, *dH_ = nullptr, *dy_ = nullptr, *ds_ = nullptr;
  std::int64_t n_tok_ = 0;  // of the last forward pass
};

template <class Real>
const Real* GatedResidualTrunk<Real>::forward(const Pass<Real>& pass) {
  n_tok_ = pass.n_tok();
  const std::int64_t n = n_tok_;
  const ModelConfig& c = p_.config;
  const int d = c.d_model, L = c.n_sublayers();
  k::stream_expand(mod_[0].H, p_.buffers.emb, n, c.gr_n, d);  // every branch starts as the embedding
  for (int j = 0; j < L; ++j) {
    Module& m = mod_[static_cast<std::size_t>(j)];
    SublayerActivations<Real>& a = p_.bodies.at(j);
    k::gr_read_forward(module(j), a.x, m.saved, scratch_);  // the body's input, no pre-norm
    if (is_attention(j)) {
      p_.bodies.attention_forward(j, a.x, a.x, a.x, m.y, false, pass);
    } else {
      p_.bodies.mlp_forward(j, a.x, m.y, false, pass);
    }
    k::gr_write_forward(mod_[static_cast<std::size_t>(j + 1)].H, m.H, m.saved.beta, m.y, n, c.gr_n, d);
  }
  k::gr_read_forward(module(L), out_, mod_[static_cast<std::size_t>(L)].saved, scratch_);
  return out_;
}

template <class Real>
void GatedResidualTrunk<Real>::backward(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const ModelConfig& c = p_.config;
  const int d = c.d_model, L = c.n_sublayers();
  const TrunkBuffers<Real>& b = p_.buffers;
  auto grads = [&](int j) {
    const ModuleWeights<Real>& g = g_[static_cast<std::size_t>(j)];
    return k::GatedResidualGrads<Real>{g.norm, g.w_down, g.w_up, g.w_inject};
  };
  // b.dh: the gradient of the final mixer's output (the LM head's input).
  k::zero(dH_, n * c.gr_n * d);
  k::gr_read_backward<Real>(module(L), mod_[static_cast<std::size_t>(L)].saved, b.dh, nullptr, dH_, grads(L), scratch_);
  for (int j = L - 1; j >= 0; --j) {
    const Module& m = mod_[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = p_.bodies.at(j);
    k::gr_write_backward(dy_, ds_, dH_, m.y, m.saved.beta, n, c.gr_n, d);  // dH_ stays: the residual path
    if (is_attention(j)) {
      p_.bodies.attention_backward(j, dy_, a.x, a.x, a.x, b.dx, b.dx, b.dx, pass);
    } else {
      p_.bodies.mlp_backward(j, dy_, a.x, b.dx, pass);
    }
    k::gr_read_backward(module(j), m.saved, b.dx, ds_, dH_, grads(j), scratch_);
  }
  k::stream_reduce(b.demb, dH_, n, c.gr_n, d);  // the entry's copies: their gradients add up
}

// The gates as connections (model/diagnostics.hpp), averaged over the tokens of the passes shown:
// "gr.read", one row per module (target j; the final mixer: 2L) over the n branches (sources
// 0..n-1), the read gates' mean over channels; "gr.write", one row per sublayer, the write gates.
template <class Real>
class GateSum final : public MixingSum {
 public:
  GateSum(const GatedResidualTrunk<Real>& trunk, const ModelConfig& c)
      : trunk_(trunk), n_(c.gr_n), L_(c.n_sublayers()),
        read_(static_cast<std::size_t>((L_ + 1) * n_), 0.0), write_(static_cast<std::size_t>(L_ * n_), 0.0) {}

  void add_pass() override {
    for (std::int64_t t = 0; t < trunk_.tokens(); ++t)
      for (int j = 0; j <= L_; ++j)
        for (int i = 0; i < n_; ++i) {
          read_[static_cast<std::size_t>(j * n_ + i)] += static_cast<double>(trunk_.read_gates(j, t)[i]);
          if (j < L_) write_[static_cast<std::size_t>(j * n_ + i)] += static_cast<double>(trunk_.write_gates(j, t)[i]);
        }
    tokens_ += trunk_.tokens();
  }

  std::vector<Connections> connections() const override {
    return {table("gr.read", read_, L_ + 1), table("gr.write", write_, L_)};
  }

 private:
  Connections table(const char* name, const std::vector<double>& sum, int rows) const {
    Connections out{name, {}};
    const double scale = tokens_ > 0 ? 1.0 / static_cast<double>(tokens_) : 0.0;
    for (int j = 0; j < rows; ++j) {
      ConnectionRow row{j, {}, {}};
      for (int i = 0; i < n_; ++i) {
        row.sources.push_back(i);
        row.weights.push_back(sum[static_cast<std::size_t>(j * n_ + i)] * scale);
      }
      out.rows.push_back(std::move(row));
    }
    return out;
  }

  const GatedResidualTrunk<Real>& trunk_;
  int n_, L_;
  std::vector<double> read_, write_;  // sums over tokens, [module, branch]
  std::int64_t tokens_ = 0;
};

template <class Real>
std::unique_ptr<MixingSum> GatedResidualTrunk<Real>::mixing_sum() const {
  return std::make_unique<GateSum<Real>>(*this, p_.config);
}

}  // namespace

template <class Real>
std::unique_ptr<Trunk<Real>> make_gated_residual_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<GatedResidualTrunk<Real>>(parts);
}

template std::unique_ptr<Trunk<float>> make_gated_residual_trunk(const ModelParts<float>&);
template std::unique_ptr<Trunk<double>> make_gated_residual_trunk(const ModelParts<double>&);

const ResidualFamily& gated_residual_family() {
  using M = ModelConfig;
  using R = ResidualMode;
  static const ResidualFamily family = {
      .name = "gated residual",
      // GR's gates (spec §2.7): per branch, the read gates' channel mean and the write gates.
      .modes = {{R::gr, "gr", true, {.connections = true}}},
      .trunk_float = make_gated_residual_trunk<float>,
      .trunk_double = make_gated_residual_trunk<double>,
      // CUDA (src/cuda, issue #48): every gr_n, gr_rank and gr_decay_norm, with the value residual.
      .add_params = add_gated_residual_params,
      .static_connections = nullptr,  // per token only (its gates)
      .residual_flops = gated_residual_flops,
      .model_norms = false,
      .keys = {{"gr_n", {R::gr}}, {"gr_rank", {R::gr}}, {"gr_decay_norm", {R::gr}}},
      .connections = {{"gr.read", ConnectionAxis::branch, {}}, {"gr.write", ConnectionAxis::branch, {}}},
      .arms = {{"gr", [](M& m) { m.residual = R::gr; }}},  // gr_n, gr_rank, gr_decay_norm from the config
  };
  return family;
}

}  // namespace attnres
