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
#include "model/family.hpp"
#include "model/model.hpp"
#include "model/mudd_trunk.hpp"
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

namespace mudd {

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

}  // namespace mudd
template <class Real>
std::unique_ptr<Trunk<Real>> make_mudd_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<mudd::MuddTrunk<Real>>(parts);
}

#define ATTNRES_MUDD_INSTANTIATIONS(Real) \
  template std::unique_ptr<Trunk<Real>> make_mudd_trunk(const ModelParts<Real>&);
ATTNRES_MUDD_INSTANTIATIONS(float)
ATTNRES_MUDD_INSTANTIATIONS(double)
#undef ATTNRES_MUDD_INSTANTIATIONS

const ResidualFamily& mudd_family() {
  using M = ModelConfig;
  using R = ResidualMode;
  static const ResidualFamily family = {
      .name = "MUDD",
      // MUDD's routing: its Q, K and V ways (mudd_ways = qkvr); its connections: the ways' weights.
      .modes = {{R::mudd, "mudd", true, {.routing = true, .connections = true}}},
      .trunk_float = make_mudd_trunk<float>,
      .trunk_double = make_mudd_trunk<double>,
      // CUDA (src/cuda/cuda_model_mudd.cpp, issue #48): every variant.
      .add_params = add_mudd_params,
      .static_connections = nullptr,  // per token only
      .residual_flops = mudd_residual_flops,
      .connections = {{"mudd.q", ConnectionAxis::source, {}},
                      {"mudd.k", ConnectionAxis::source, {}},
                      {"mudd.v", ConnectionAxis::source, {}},
                      {"mudd.r", ConnectionAxis::source, {}}},
      .arms = {{"mudd", [](M& m) { m.residual = R::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = true; }},
               {"mudd-static",
                [](M& m) { m.residual = R::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = false; }},
               {"mudd-r", [](M& m) { m.residual = R::mudd, m.mudd_ways = MuddWays::r, m.mudd_dynamic = true; }}},
  };
  return family;
}

}  // namespace attnres
