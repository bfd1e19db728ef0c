// The MUDDFormer trunk (baselines-spec §2): block b reads four streams, Q, K and V through three
// pre-norms (or one stream, mudd_ways = r), h = x_R + Attn, X_{b+1} = h + MLP(RMSNorm(h)); the DA
// module after it mixes the block outputs X_0..X_{b+1} (X_0: the embedding) into the next block's
// streams with per-token weights (kernels/mudd.hpp). The last DA writes R alone: the final norm's
// input. PrePostDANorm mixes normalised sources X^_j, each with its own norm shared by all DAs.
//
// Saved for the backward, per block: its Q, K, V inputs and their normalised forms (the R stream is
// written straight into the attention sublayer's out, to which attention adds), and the DA's dw,
// generator hidden and RMS factor; the sublayer bodies keep what sublayers.cpp keeps.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "kernels/depth_read.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/mudd.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

// baselines-spec §2.4: per DA module its generator (none when static), then the C-way mix of S
// sources; x3 for forward and backward.
double mudd_residual_flops(const ModelConfig& c) {
  const double d = c.d_model;
  double flops = 0;
  for (int i = 0; i < c.n_layers; ++i) {
    const double cs = double(c.mudd_da_ways(i)) * c.mudd_da_sources(i);
    const double K = c.mudd_dynamic ? c.mudd_da_hidden(i) : 0;
    flops += 6 * (d * K + K * cs + cs * d);
  }
  return flops;
}

namespace {

// MUDD's DA modules (baselines-spec §2.1-2.2, names §6.6): at initialisation every stream is the
// block output, so the model computes prenorm's function bit for bit. Only W1 draws from the RNG
// (its own stream, by name); W2, a and the norms are fixed values.
void add_da_modules(ParamLayout& layout, const ModelConfig& c) {
  const std::int64_t d = c.d_model;
  const bool decay = c.mudd_decay_all;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "mudd." + std::to_string(i) + ".";
    const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i), K = c.mudd_da_hidden(i);
    if (c.mudd_dynamic) {
      layout.add(p + "w1", {K, d}, ParamKind::matrix, 1.0 / std::sqrt(static_cast<double>(d)));  // N(0, 1/d)
      layout.add_fixed(p + "w2", std::vector<double>(static_cast<std::size_t>(C * S * K), 0.0), true, {C * S, K});
    }
    // a: the block output (the last source) in every way (base); zero with PrePostDANorm, whose
    // streams are x + the mix.
    std::vector<double> a(static_cast<std::size_t>(C * S), 0.0);
    if (!c.mudd_prepost_norm)
      for (int w = 0; w < C; ++w) a[static_cast<std::size_t>(w * S + S - 1)] = 1.0;
    layout.add_fixed(p + "a", std::move(a), decay, {C, S});
    if (c.mudd_prepost_norm) {
      if (c.mudd_dynamic) layout.add(p + "gen_norm.weight", {d}, ParamKind::norm_weight).decay = decay;
      layout.add_fixed(p + "post_norm.weight", std::vector<double>(static_cast<std::size_t>(d), 1e-3), decay);
    }
  }
  if (c.mudd_prepost_norm)
    for (int s = 0; s <= c.n_layers; ++s)
      layout.add("mudd.src_norm." + std::to_string(s) + ".weight", {d}, ParamKind::norm_weight).decay = decay;
}

}  // namespace

// The K and V inputs' own norms right after the attention norm (Q's; mudd_sep_qkv_norm), the DA
// modules and PrePostDANorm's source norms after the layers.
void add_mudd_params(ParamLayout& layout, const ModelConfig& c, ParamPlace place, int layer) {
  if (place == ParamPlace::attention_norm && c.mudd_multiway() && c.mudd_sep_qkv_norm) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    layout.add(p + "attn_norm_k.weight", {c.d_model}, ParamKind::norm_weight);
    layout.add(p + "attn_norm_v.weight", {c.d_model}, ParamKind::norm_weight);
  }
  if (place == ParamPlace::after_layers) add_da_modules(layout, c);
}

void mudd_way_distribution(std::span<const float> dw, std::span<const float> norms, std::span<double> p) {
  require(dw.size() == p.size() && norms.size() == p.size() && !p.empty(), "mudd_way_distribution: ", dw.size(),
          " weights, ", norms.size(), " norms and ", p.size(), " outputs");
  double sum = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    p[j] = std::abs(double(dw[j])) * double(norms[j]);
    sum += p[j];
  }
  if (sum == 0) {  // the way mixes nothing in: see model/diagnostics.hpp
    std::fill(p.begin(), p.end(), 0.0);
    p.back() = 1;
    return;
  }
  for (double& x : p) x /= sum;  // (NaN weights stay NaN, as a diverged model's softmax would)
}

namespace {

// One DA module's tensors (baselines-spec §2), in the parameters or in their gradients; null where
// the variant has none.
template <class Real>
struct DaWeights {
  Real* w1 = nullptr;         // [K, d]; null: static
  Real* w2 = nullptr;         // [C*S, K]
  Real* a = nullptr;          // [C, S]
  Real* gen_norm = nullptr;   // PrePostDANorm (dynamic)
  Real* post_norm = nullptr;  // PrePostDANorm
};

template <class Real>
std::vector<DaWeights<Real>> bind_da_modules(const ModelConfig& c, const ParamLayout& layout, std::span<Real> flat) {
  std::vector<DaWeights<Real>> out;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "mudd." + std::to_string(i) + ".";
    out.push_back({param_view(layout, flat, p + "w1"), param_view(layout, flat, p + "w2"),
                   param_view(layout, flat, p + "a"), param_view(layout, flat, p + "gen_norm.weight"),
                   param_view(layout, flat, p + "post_norm.weight")});
  }
  return out;
}

// The tensors named prefix{i}suffix for i in [0, n) (null where absent).
template <class Real>
std::vector<Real*> bind_each(const ParamLayout& layout, std::span<Real> flat, const std::string& prefix, int n,
                             const std::string& suffix) {
  std::vector<Real*> out;
  for (int i = 0; i < n; ++i) out.push_back(param_view(layout, flat, prefix + std::to_string(i) + suffix));
  return out;
}

// The three attention input norms of block i (one weight for all with mudd_sep_qkv_norm = false).
template <class Real>
std::array<Real*, 3> attention_norms(int i, const ModelWeights<Real>& w, const std::vector<Real*>& k_norm,
                                     const std::vector<Real*>& v_norm) {
  const auto b = static_cast<std::size_t>(i);
  Real* q = w.layers[b].attn_norm;
  return {q, k_norm[b] != nullptr ? k_norm[b] : q, v_norm[b] != nullptr ? v_norm[b] : q};
}

// The checks of a query about DA module `da` and one token of the last forward pass (n_tok tokens),
// with an output of one value per source.
void check_mudd_query(const ModelConfig& config, int da, std::int64_t token, std::int64_t n_tok, std::size_t size) {
  require(config.residual == ResidualMode::mudd && da >= 0 && da < config.n_layers, "the model has no MUDD DA ", da);
  require(token >= 0 && token < n_tok, "token index out of range");
  require(static_cast<int>(size) == config.mudd_da_sources(da), "MUDD DA ", da, " has ", config.mudd_da_sources(da),
          " sources, not ", size);
}

template <class Real>
class MuddTrunk final : public Trunk<Real> {
 public:
  explicit MuddTrunk(const ModelParts<Real>& parts)
      : p_(parts),
        da_w_(bind_da_modules(parts.config, parts.layout, parts.params)),
        da_g_(bind_da_modules(parts.config, parts.layout, parts.grads)),
        src_norm_w_(bind_each(parts.layout, parts.params, "mudd.src_norm.", parts.config.n_layers + 1, ".weight")),
        src_norm_g_(bind_each(parts.layout, parts.grads, "mudd.src_norm.", parts.config.n_layers + 1, ".weight")),
        k_norm_w_(bind_each(parts.layout, parts.params, "layers.", parts.config.n_layers, ".attn_norm_k.weight")),
        k_norm_g_(bind_each(parts.layout, parts.grads, "layers.", parts.config.n_layers, ".attn_norm_k.weight")),
        v_norm_w_(bind_each(parts.layout, parts.params, "layers.", parts.config.n_layers, ".attn_norm_v.weight")),
        v_norm_g_(bind_each(parts.layout, parts.grads, "layers.", parts.config.n_layers, ".attn_norm_v.weight")),
        sub_(static_cast<std::size_t>(parts.config.n_sublayers())),
        blocks_(static_cast<std::size_t>(parts.config.n_layers)) {}

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override;
  std::int64_t reduce_scratch(std::int64_t bt) const override {
    return k::rmsnorm_scratch_size(bt, p_.config.d_model);
  }
  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: block b's attention reads the Q, K and V ways of DA b-1 (mudd_ways = qkvr; block
  // 0 reads the embedding alone), each token's weights made distributions by
  // mudd_way_distribution; the connections are the ways' weights averaged over tokens.
  std::vector<RoutedInput> routed_inputs() const override {
    std::vector<RoutedInput> out;
    for (int b = 0; b < p_.config.n_layers && p_.config.mudd_multiway(); ++b)
      out.push_back({b, b == 0 ? 1 : p_.config.mudd_da_sources(b - 1), 3});
    return out;
  }
  void route_distributions(int index, std::int64_t token, std::span<double> p) const override;
  std::unique_ptr<MixingSum> mixing_sum() const override;
  std::int64_t tokens() const override { return n_tok_; }

  // Model::mudd_weights and Model::mudd_source_norms.
  void mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const;
  void mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const;

 private:
  // Sublayer j's output: the attention sublayer's is the block's h (the R stream is written
  // straight into it, and attention adds to it), the MLP's the block output X_{b+1}.
  struct Sublayer {
    Real* out = nullptr;
    Real* dout = nullptr;
  };
  // By block b: the raw inputs of its attention's Q, K and V norms (block 0 reads the embedding;
  // mudd_ways = r has one input, in[0]), the normalised K and V inputs (Q's is the attention
  // body's x) and their RMS factors, and what the DA after the block saves: dw, the generator's
  // pre-GELU hidden and its input's RMS factor (dynamic only).
  struct Block {
    Real* in[3] = {nullptr, nullptr, nullptr};
    Real *xk = nullptr, *xv = nullptr, *rstd_k = nullptr, *rstd_v = nullptr;
    Real *dw = nullptr, *hidden = nullptr, *rms = nullptr;
  };

  // The block output X_j (X_0: the embedding) and its gradient.
  const Real* block_output(int j) const {
    return j == 0 ? p_.buffers.emb : sub_[static_cast<std::size_t>(2 * j - 1)].out;
  }
  Real* dblock_output(int j) {
    return j == 0 ? p_.buffers.demb : sub_[static_cast<std::size_t>(2 * j - 1)].dout;
  }
  // DA module i's view for the kernels (`sources` receives its source pointers).
  k::MuddDa<Real> mudd_da(int i, const Real** sources) const;

  const ModelParts<Real> p_;
  std::vector<DaWeights<Real>> da_w_, da_g_;    // by DA module
  std::vector<Real*> src_norm_w_, src_norm_g_;  // PrePostDANorm: X_0..X_{n_layers}'s norms
  std::vector<Real*> k_norm_w_, k_norm_g_, v_norm_w_, v_norm_g_;  // by block (qkvr, mudd_sep_qkv_norm)
  std::vector<Sublayer> sub_;
  std::vector<Block> blocks_;
  // PrePostDANorm: the normalised sources X^_0..X^_L, their RMS factors and their gradients.
  std::vector<Real*> src_, src_rstd_, dsrc_;
  Real* out_ = nullptr;                          // the last DA's R stream: the final norm's input
  Real* scratch_ = nullptr;                      // the DA kernels' (forward and backward)
  Real* din_[3] = {nullptr, nullptr, nullptr};  // gradients of a block's Q, K, V inputs
  Real *dxk_ = nullptr, *dxv_ = nullptr;         // attention's K and V input gradients (qkvr)
  std::int64_t n_tok_ = 0;                       // of the last forward pass
};

template <class Real>
void MuddTrunk<Real>::carve(ArenaCarver<Real>& arena, std::int64_t bt) {
  auto take = [&](std::int64_t n) { return arena.take(n); };
  const ModelConfig& cfg = p_.config;
  const std::int64_t d = cfg.d_model;
  const int L = cfg.n_layers;
  const bool multiway = cfg.mudd_multiway(), with_grad = !p_.grads.empty();
  for (Sublayer& s : sub_) {
    s.out = take(bt * d);
    if (with_grad) s.dout = take(bt * d);
  }
  std::int64_t scratch = 0;
  for (int i = 0; i < L; ++i) {
    Block& m = blocks_[static_cast<std::size_t>(i)];
    if (i > 0)
      for (int c = 0; c < (multiway ? 3 : 1); ++c) m.in[c] = take(bt * d);
    if (multiway) {
      m.xk = take(bt * d);
      m.xv = take(bt * d);
      m.rstd_k = take(bt);
      m.rstd_v = take(bt);
    }
    const int C = cfg.mudd_da_ways(i), S = cfg.mudd_da_sources(i), K = cfg.mudd_da_hidden(i);
    if (cfg.mudd_dynamic) {
      m.dw = take(bt * C * S);
      m.hidden = take(bt * K);
      m.rms = take(bt);
    }
    scratch = std::max(scratch, k::mudd_scratch_size(bt, cfg.d_model, C, S, cfg.mudd_dynamic ? K : 0));
  }
  src_.clear();
  src_rstd_.clear();
  dsrc_.clear();
  if (cfg.mudd_prepost_norm)
    for (int j = 0; j <= L; ++j) {
      src_.push_back(take(bt * d));
      src_rstd_.push_back(take(bt));
      if (with_grad) dsrc_.push_back(take(bt * d));
    }
  out_ = take(bt * d);
  scratch_ = take(scratch);
  if (with_grad) {
    for (int c = 0; c < (multiway ? 3 : 1); ++c) din_[c] = take(bt * d);
    if (multiway) {
      dxk_ = take(bt * d);
      dxv_ = take(bt * d);
    }
  }
}

template <class Real>
void MuddTrunk<Real>::mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const {
  check_mudd_query(p_.config, da, token, n_tok_, dw.size());
  const int C = p_.config.mudd_da_ways(da), S = p_.config.mudd_da_sources(da);
  require(way >= 0 && way < C, "MUDD DA ", da, " has no way ", way);
  const Real* w = p_.config.mudd_dynamic ? blocks_[static_cast<std::size_t>(da)].dw + token * C * S
                                       : da_w_[static_cast<std::size_t>(da)].a;
  std::copy(w + way * S, w + (way + 1) * S, dw.begin());
}

template <class Real>
void MuddTrunk<Real>::mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const {
  check_mudd_query(p_.config, da, token, n_tok_, norms.size());
  const Real* sources[k::kMaxSources];
  const k::MuddDa<Real> view = mudd_da(da, sources);  // the very buffers the DA mixed
  for (int j = 0; j < view.n_sources; ++j) {
    const Real* x = view.sources[j] + token * view.d;
    double ss = 0;
    for (int e = 0; e < view.d; ++e) ss += double(x[e]) * double(x[e]);
    norms[static_cast<std::size_t>(j)] = static_cast<Real>(std::sqrt(ss));
  }
}

template <class Real>
void MuddTrunk<Real>::route_distributions(int index, std::int64_t token, std::span<double> p) const {
  if (index == 0) {  // the embedding alone, on every way
    std::fill(p.begin(), p.end(), 1.0);
    return;
  }
  const int da = index - 1;
  const auto n = static_cast<std::size_t>(p_.config.mudd_da_sources(da));
  // (Also tells the compiler the copies below stay inside the arrays.)
  require(n >= 1 && n <= k::kMaxSources, "MUDD DA ", da, " has ", n, " sources, outside 1..", k::kMaxSources);
  Real norms[k::kMaxSources], dw[k::kMaxSources];
  float norms_f[k::kMaxSources], dw_f[k::kMaxSources];  // (the distribution is defined on fp32 weights)
  mudd_source_norms(da, token, std::span<Real>(norms, n));
  std::copy(norms, norms + n, norms_f);
  for (int way = 0; way < 3; ++way) {  // Q, K, V (kernels/mudd.hpp's way order; R is the fourth)
    mudd_weights(da, way, token, std::span<Real>(dw, n));
    std::copy(dw, dw + n, dw_f);
    mudd_way_distribution(std::span<const float>(dw_f, n), std::span<const float>(norms_f, n),
                          p.subspan(way * n, n));
  }
}

// The token means of every DA's mixing weights, per way ("mudd.q", "mudd.k", "mudd.v", "mudd.r";
// the last DA writes R alone): one row per DA module (target i+1: the block it feeds, n_layers:
// the final norm), sources 0..i+1.
template <class Real>
class MuddMixingSum final : public MixingSum {
 public:
  MuddMixingSum(const MuddTrunk<Real>& trunk, const ModelConfig& c)
      : trunk_(trunk), c_(c), dw_(static_cast<std::size_t>(c.n_layers + 1)) {
    static constexpr const char* kWayNames[] = {"mudd.q", "mudd.k", "mudd.v", "mudd.r"};
    const int max_ways = c.mudd_da_ways(0);
    // sums_[w] is way w of the 4-way DAs; R is the last way of every DA (and the only one of the last).
    for (int w = 0; w < max_ways; ++w) sums_.push_back({max_ways == 1 ? "mudd.r" : kWayNames[w], {}});
    for (int i = 0; i < c.n_layers; ++i) {
      const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i);
      for (int w = 0; w < C; ++w) {
        ConnectionRow row;
        row.target = i + 1;
        for (int j = 0; j < S; ++j) row.sources.push_back(j);
        row.weights.assign(static_cast<std::size_t>(S), 0.0);
        way(i, w).rows.push_back(std::move(row));
      }
    }
  }

  void add_pass() override {
    const std::int64_t n_tok = trunk_.tokens();
    for (int i = 0; i < c_.n_layers; ++i) {
      const int C = c_.mudd_da_ways(i), S = c_.mudd_da_sources(i);
      for (int w = 0; w < C; ++w) {
        std::vector<double>& sum = way(i, w).rows[static_cast<std::size_t>(i)].weights;
        for (std::int64_t t = 0; t < n_tok; ++t) {
          trunk_.mudd_weights(i, w, t, std::span<Real>(dw_.data(), static_cast<std::size_t>(S)));
          for (int j = 0; j < S; ++j) sum[static_cast<std::size_t>(j)] += dw_[static_cast<std::size_t>(j)];
        }
      }
    }
    tokens_ += n_tok;
  }
  std::vector<Connections> connections() const override {
    std::vector<Connections> out = sums_;
    for (auto& w : out)
      for (auto& row : w.rows)
        for (double& x : row.weights) x /= double(tokens_);
    return out;
  }

 private:
  Connections& way(int da, int w) {
    const int max_ways = c_.mudd_da_ways(0);
    return sums_[static_cast<std::size_t>(c_.mudd_da_ways(da) == max_ways ? w : max_ways - 1)];
  }

  const MuddTrunk<Real>& trunk_;
  const ModelConfig& c_;
  std::vector<Connections> sums_;
  std::vector<Real> dw_;
  std::int64_t tokens_ = 0;
};

template <class Real>
std::unique_ptr<MixingSum> MuddTrunk<Real>::mixing_sum() const {
  return std::make_unique<MuddMixingSum<Real>>(*this, p_.config);
}

template <class Real>
k::MuddDa<Real> MuddTrunk<Real>::mudd_da(int i, const Real** sources) const {
  const DaWeights<Real>& w = da_w_[static_cast<std::size_t>(i)];
  const bool prepost = p_.config.mudd_prepost_norm;
  k::MuddDa<Real> da;
  da.n_sources = p_.config.mudd_da_sources(i);
  for (int j = 0; j < da.n_sources; ++j)
    sources[j] = prepost ? src_[static_cast<std::size_t>(j)] : block_output(j);
  da.sources = sources;
  da.n_ways = p_.config.mudd_da_ways(i);
  da.n_tok = n_tok_;
  da.d = p_.config.d_model;
  da.eps = static_cast<Real>(p_.config.norm_eps);
  da.x = block_output(i + 1);
  da.hidden = p_.config.mudd_dynamic ? p_.config.mudd_da_hidden(i) : 0;
  da.gen_norm = w.gen_norm;
  da.w1 = w.w1;
  da.w2 = w.w2;
  da.gelu = p_.config.mudd_gelu;
  da.a = w.a;
  da.post_norm = w.post_norm;
  return da;
}

template <class Real>
const Real* MuddTrunk<Real>::forward(const Pass<Real>& pass) {
  n_tok_ = pass.n_tok();
  const std::int64_t n = n_tok_;
  const ModelConfig& cfg = p_.config;
  const int d = cfg.d_model, L = cfg.n_layers;
  const Real eps = static_cast<Real>(cfg.norm_eps);
  const bool multiway = cfg.mudd_multiway(), prepost = cfg.mudd_prepost_norm;
  const TrunkBuffers<Real>& b = p_.buffers;
  if (prepost)
    k::rmsnorm_forward(src_[0], src_rstd_[0], b.emb, src_norm_w_[0], n, d, eps);
  for (int i = 0; i < L; ++i) {
    auto& m = blocks_[static_cast<std::size_t>(i)];
    Sublayer& att = sub_[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = sub_[static_cast<std::size_t>(2 * i + 1)];
    SublayerActivations<Real>& att_a = p_.bodies.at(2 * i);
    SublayerActivations<Real>& mlp_a = p_.bodies.at(2 * i + 1);
    const LayerWeights<Real>& lw = p_.w.layers[static_cast<std::size_t>(i)];
    // The block: Q, K, V through their norms; R (already in att.out, or copied there) plus attention.
    const Real* in_q = i == 0 ? b.emb : m.in[0];
    k::rmsnorm_forward(att_a.x, att_a.rstd, in_q, lw.attn_norm, n, d, eps);
    const Real *xk = att_a.x, *xv = att_a.x;
    if (multiway) {
      const auto norms = attention_norms(i, p_.w, k_norm_w_, v_norm_w_);
      const Real* in_k = i == 0 ? b.emb : m.in[1];
      const Real* in_v = i == 0 ? b.emb : m.in[2];
      k::rmsnorm_forward(m.xk, m.rstd_k, in_k, norms[1], n, d, eps);
      k::rmsnorm_forward(m.xv, m.rstd_v, in_v, norms[2], n, d, eps);
      xk = m.xk;
      xv = m.xv;
    }
    if (i == 0 || !multiway) k::copy(att.out, in_q, n * d);  // R: the embedding, or the single stream
    p_.bodies.attention_forward(2 * i, att_a.x, xk, xv, att.out, true, pass);
    k::rmsnorm_forward(mlp_a.x, mlp_a.rstd, att.out, lw.mlp_norm, n, d, eps);
    k::copy(mlp.out, att.out, n * d);
    p_.bodies.mlp_forward(2 * i + 1, mlp_a.x, mlp.out, true, pass);
    if (prepost)
      k::rmsnorm_forward(src_[static_cast<std::size_t>(i + 1)], src_rstd_[static_cast<std::size_t>(i + 1)],
                         mlp.out, src_norm_w_[static_cast<std::size_t>(i + 1)], n, d, eps);
    // The DA after the block: the next block's streams (Q, K, V into its in[], R into its
    // attention's out), or the model's output.
    const Real* sources[k::kMaxSources];
    const k::MuddDa<Real> da = mudd_da(i, sources);
    Real* out[k::kMaxWays] = {out_};
    if (i + 1 < L) {
      auto& next = blocks_[static_cast<std::size_t>(i + 1)];
      if (multiway) {
        for (int c = 0; c < 3; ++c) out[c] = next.in[c];
        out[3] = sub_[static_cast<std::size_t>(2 * i + 2)].out;
      } else {
        out[0] = next.in[0];
      }
    }
    k::mudd_forward(da, out, m.dw, m.hidden, m.rms, scratch_);
  }
  return out_;
}

template <class Real>
void MuddTrunk<Real>::backward(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const ModelConfig& cfg = p_.config;
  const int d = cfg.d_model, L = cfg.n_layers;
  const bool multiway = cfg.mudd_multiway(), prepost = cfg.mudd_prepost_norm;
  const TrunkBuffers<Real>& b = p_.buffers;
  const int n_in = multiway ? 3 : 1;
  for (Sublayer& s : sub_)
    if (s.dout != nullptr) k::zero(s.dout, n * d);
  for (Real* g : dsrc_) k::zero(g, n * d);
  // b.dh holds the last DA's R gradient.
  for (int i = L - 1; i >= 0; --i) {
    auto& m = blocks_[static_cast<std::size_t>(i)];
    Sublayer& att = sub_[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = sub_[static_cast<std::size_t>(2 * i + 1)];
    const SublayerActivations<Real>& att_a = p_.bodies.at(2 * i);
    const SublayerActivations<Real>& mlp_a = p_.bodies.at(2 * i + 1);
    const LayerWeights<Real>& lw = p_.w.layers[static_cast<std::size_t>(i)];
    LayerWeights<Real>& lg = p_.g.layers[static_cast<std::size_t>(i)];

    // DA_i: its streams' gradients are complete (block i+1's inputs, or the final norm's); it
    // scatters into every source it read, which completes dX_{i+1} (later DAs ran already).
    {
      const Real* sources[k::kMaxSources];
      const k::MuddDa<Real> da = mudd_da(i, sources);
      const Real* dout[k::kMaxWays] = {b.dh};
      if (i + 1 < L) {
        for (int c = 0; c < n_in; ++c) dout[c] = din_[c];
        if (multiway) dout[3] = sub_[static_cast<std::size_t>(2 * i + 2)].dout;
      }
      Real* dsources[k::kMaxSources];
      for (int j = 0; j < da.n_sources; ++j)
        dsources[j] = prepost ? dsrc_[static_cast<std::size_t>(j)] : dblock_output(j);
      const DaWeights<Real>& gw = da_g_[static_cast<std::size_t>(i)];
      k::MuddGrads<Real> gr;
      gr.dout = dout;
      gr.dsources = dsources;
      gr.dx = dblock_output(i + 1);
      gr.dw1 = gw.w1;
      gr.dw2 = gw.w2;
      gr.da = gw.a;
      gr.dgen_norm = gw.gen_norm;
      gr.dpost_norm = gw.post_norm;
      k::mudd_backward(da, m.dw, m.hidden, m.rms, gr, scratch_);
    }
    if (prepost) {  // X^_{i+1}'s last reader was DA_i: through its norm, once
      const auto s = static_cast<std::size_t>(i + 1);
      k::rmsnorm_backward(b.dx, src_norm_g_[s], dsrc_[s], block_output(i + 1), src_norm_w_[s],
                          src_rstd_[s], n, d, b.reduce);
      k::add_into(dblock_output(i + 1), b.dx, n * d);
    }

    // The block: the MLP's residual and sublayer into dh = att.dout, then attention.
    k::add_into(att.dout, mlp.dout, n * d);
    p_.bodies.mlp_backward(2 * i + 1, mlp.dout, mlp_a.x, b.dx, pass);
    k::rmsnorm_backward(b.dh, lg.mlp_norm, b.dx, att.out, lw.mlp_norm, mlp_a.rstd, n, d, b.reduce);
    k::add_into(att.dout, b.dh, n * d);
    const Real* in_q = i == 0 ? b.emb : m.in[0];
    if (multiway) {
      const auto norms = attention_norms(i, p_.w, k_norm_w_, v_norm_w_);
      const auto gnorms = attention_norms(i, p_.g, k_norm_g_, v_norm_g_);
      p_.bodies.attention_backward(2 * i, att.dout, att_a.x, m.xk, m.xv, b.dx, dxk_, dxv_, pass);
      k::rmsnorm_backward(din_[0], gnorms[0], b.dx, in_q, norms[0], att_a.rstd, n, d, b.reduce);
      k::rmsnorm_backward(din_[1], gnorms[1], dxk_, i == 0 ? b.emb : m.in[1], norms[1], m.rstd_k, n, d,
                          b.reduce);
      k::rmsnorm_backward(din_[2], gnorms[2], dxv_, i == 0 ? b.emb : m.in[2], norms[2], m.rstd_v, n, d,
                          b.reduce);
      // R's gradient is att.dout itself (h = x_R + Attn), read by DA_{i-1} there.
    } else {
      p_.bodies.attention_backward(2 * i, att.dout, att_a.x, att_a.x, att_a.x, b.dx, b.dx, b.dx, pass);
      k::rmsnorm_backward(din_[0], lg.attn_norm, b.dx, in_q, lw.attn_norm, att_a.rstd, n, d, b.reduce);
      k::add_into(din_[0], att.dout, n * d);  // the single stream also feeds R
    }
    if (i == 0) {  // block 0 reads the embedding on every stream
      for (int c = 0; c < n_in; ++c) k::add_into(b.demb, din_[c], n * d);
      if (multiway) k::add_into(b.demb, att.dout, n * d);
    }
  }
  if (prepost) {
    k::rmsnorm_backward(b.dx, src_norm_g_[0], dsrc_[0], b.emb, src_norm_w_[0], src_rstd_[0], n,
                        d, b.reduce);
    k::add_into(b.demb, b.dx, n * d);
  }
}

}  // namespace

template <class Real>
std::unique_ptr<Trunk<Real>> make_mudd_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<MuddTrunk<Real>>(parts);
}

template <class Real>
void Model<Real>::mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const {
  const auto* trunk = dynamic_cast<const MuddTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no MUDD DA ", da);
  trunk->mudd_weights(da, way, token, dw);
}

template <class Real>
void Model<Real>::mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const {
  const auto* trunk = dynamic_cast<const MuddTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no MUDD DA ", da);
  trunk->mudd_source_norms(da, token, norms);
}

#define ATTNRES_MUDD_INSTANTIATIONS(Real)                                                 \
  template std::unique_ptr<Trunk<Real>> make_mudd_trunk(const ModelParts<Real>&);         \
  template void Model<Real>::mudd_weights(int, int, std::int64_t, std::span<Real>) const; \
  template void Model<Real>::mudd_source_norms(int, std::int64_t, std::span<Real>) const;
ATTNRES_MUDD_INSTANTIATIONS(float)
ATTNRES_MUDD_INSTANTIATIONS(double)
#undef ATTNRES_MUDD_INSTANTIATIONS

}  // namespace attnres
