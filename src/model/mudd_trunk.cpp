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

#include "kernels/depth_read.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/mudd.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"
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

template <class Real>
void Model<Real>::carve_mudd(ArenaCarver<Real>& arena) {
  auto take = [&](std::int64_t n) { return arena.take(n); };
  const std::int64_t bt = max_batch_ * max_seq_, d = config_.d_model;
  const int L = config_.n_layers;
  const bool multiway = config_.mudd_multiway();
  Buffers& b = buf_;
  b.mudd.assign(static_cast<std::size_t>(L), {});
  std::int64_t scratch = 0;
  for (int i = 0; i < L; ++i) {
    auto& m = b.mudd[static_cast<std::size_t>(i)];
    if (i > 0)
      for (int c = 0; c < (multiway ? 3 : 1); ++c) m.in[c] = take(bt * d);
    if (multiway) {
      m.xk = take(bt * d);
      m.xv = take(bt * d);
      m.rstd_k = take(bt);
      m.rstd_v = take(bt);
    }
    const int C = config_.mudd_da_ways(i), S = config_.mudd_da_sources(i), K = config_.mudd_da_hidden(i);
    if (config_.mudd_dynamic) {
      m.dw = take(bt * C * S);
      m.hidden = take(bt * K);
      m.rms = take(bt);
    }
    scratch = std::max(scratch, k::mudd_scratch_size(bt, config_.d_model, C, S, config_.mudd_dynamic ? K : 0));
  }
  b.mudd_src.clear();
  b.mudd_src_rstd.clear();
  b.dmudd_src.clear();
  if (config_.mudd_prepost_norm)
    for (int j = 0; j <= L; ++j) {
      b.mudd_src.push_back(take(bt * d));
      b.mudd_src_rstd.push_back(take(bt));
      if (with_grad_) b.dmudd_src.push_back(take(bt * d));
    }
  b.mudd_out = take(bt * d);
  b.mudd_scratch = take(scratch);
  if (with_grad_) {
    for (int c = 0; c < (multiway ? 3 : 1); ++c) b.dmudd_in[c] = take(bt * d);
    if (multiway) b.dxk = take(bt * d);
  }
}

template <class Real>
const Real* Model<Real>::mudd_block_output(int j) const {
  return j == 0 ? buf_.emb : buf_.sub[static_cast<std::size_t>(2 * j - 1)].out;
}

template <class Real>
Real* Model<Real>::dmudd_block_output(int j) {
  return j == 0 ? buf_.demb : buf_.sub[static_cast<std::size_t>(2 * j - 1)].dout;
}

namespace {

// The checks of a query about DA module `da` and one token of the last forward pass (n_tok tokens),
// with an output of one value per source.
void check_mudd_query(const ModelConfig& config, int da, std::int64_t token, std::int64_t n_tok, std::size_t size) {
  require(config.residual == ResidualMode::mudd && da >= 0 && da < config.n_layers, "the model has no MUDD DA ", da);
  require(token >= 0 && token < n_tok, "token index out of range");
  require(static_cast<int>(size) == config.mudd_da_sources(da), "MUDD DA ", da, " has ", config.mudd_da_sources(da),
          " sources, not ", size);
}

}  // namespace

template <class Real>
void Model<Real>::mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const {
  check_mudd_query(config_, da, token, n_tok_, dw.size());
  const int C = config_.mudd_da_ways(da), S = config_.mudd_da_sources(da);
  require(way >= 0 && way < C, "MUDD DA ", da, " has no way ", way);
  const Real* w = config_.mudd_dynamic ? buf_.mudd[static_cast<std::size_t>(da)].dw + token * C * S
                                       : w_.mudd[static_cast<std::size_t>(da)].a;
  std::copy(w + way * S, w + (way + 1) * S, dw.begin());
}

template <class Real>
void Model<Real>::mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const {
  check_mudd_query(config_, da, token, n_tok_, norms.size());
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
k::MuddDa<Real> Model<Real>::mudd_da(int i, const Real** sources) const {
  const MuddDaWeights<Real>& w = w_.mudd[static_cast<std::size_t>(i)];
  const bool prepost = config_.mudd_prepost_norm;
  k::MuddDa<Real> da;
  da.n_sources = config_.mudd_da_sources(i);
  for (int j = 0; j < da.n_sources; ++j)
    sources[j] = prepost ? buf_.mudd_src[static_cast<std::size_t>(j)] : mudd_block_output(j);
  da.sources = sources;
  da.n_ways = config_.mudd_da_ways(i);
  da.n_tok = n_tok_;
  da.d = config_.d_model;
  da.eps = static_cast<Real>(config_.norm_eps);
  da.x = mudd_block_output(i + 1);
  da.hidden = config_.mudd_dynamic ? config_.mudd_da_hidden(i) : 0;
  da.gen_norm = w.gen_norm;
  da.w1 = w.w1;
  da.w2 = w.w2;
  da.gelu = config_.mudd_gelu;
  da.a = w.a;
  da.post_norm = w.post_norm;
  return da;
}

namespace {

// The three attention input norms of a block (one weight for all with mudd_sep_qkv_norm = false).
template <class Real>
std::array<Real*, 3> attention_norms(const LayerWeights<Real>& l) {
  return {l.attn_norm, l.attn_norm_k != nullptr ? l.attn_norm_k : l.attn_norm,
          l.attn_norm_v != nullptr ? l.attn_norm_v : l.attn_norm};
}

}  // namespace

template <class Real>
const Real* Model<Real>::forward_mudd(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, L = config_.n_layers;
  const Real eps = static_cast<Real>(config_.norm_eps);
  const bool multiway = config_.mudd_multiway(), prepost = config_.mudd_prepost_norm;
  Buffers& b = buf_;
  if (prepost)
    k::rmsnorm_forward(b.mudd_src[0], b.mudd_src_rstd[0], b.emb, w_.mudd_src_norm[0], n, d, eps);
  for (int i = 0; i < L; ++i) {
    auto& m = b.mudd[static_cast<std::size_t>(i)];
    Sublayer& att = b.sub[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = b.sub[static_cast<std::size_t>(2 * i + 1)];
    SublayerActivations<Real>& att_a = bodies_.at(2 * i);
    SublayerActivations<Real>& mlp_a = bodies_.at(2 * i + 1);
    const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(i)];
    // The block: Q, K, V through their norms; R (already in att.out, or copied there) plus attention.
    const Real* in_q = i == 0 ? b.emb : m.in[0];
    k::rmsnorm_forward(att_a.x, att_a.rstd, in_q, lw.attn_norm, n, d, eps);
    const Real *xk = att_a.x, *xv = att_a.x;
    if (multiway) {
      const auto norms = attention_norms(lw);
      const Real* in_k = i == 0 ? b.emb : m.in[1];
      const Real* in_v = i == 0 ? b.emb : m.in[2];
      k::rmsnorm_forward(m.xk, m.rstd_k, in_k, norms[1], n, d, eps);
      k::rmsnorm_forward(m.xv, m.rstd_v, in_v, norms[2], n, d, eps);
      xk = m.xk;
      xv = m.xv;
    }
    if (i == 0 || !multiway) k::copy(att.out, in_q, n * d);  // R: the embedding, or the single stream
    bodies_.attention_forward(2 * i, att_a.x, xk, xv, att.out, true, pass);
    k::rmsnorm_forward(mlp_a.x, mlp_a.rstd, att.out, lw.mlp_norm, n, d, eps);
    k::copy(mlp.out, att.out, n * d);
    bodies_.mlp_forward(2 * i + 1, mlp_a.x, mlp.out, true, pass);
    if (prepost)
      k::rmsnorm_forward(b.mudd_src[static_cast<std::size_t>(i + 1)], b.mudd_src_rstd[static_cast<std::size_t>(i + 1)],
                         mlp.out, w_.mudd_src_norm[static_cast<std::size_t>(i + 1)], n, d, eps);
    // The DA after the block: the next block's streams (Q, K, V into its in[], R into its
    // attention's out), or the model's output.
    const Real* sources[k::kMaxSources];
    const k::MuddDa<Real> da = mudd_da(i, sources);
    Real* out[k::kMaxWays] = {b.mudd_out};
    if (i + 1 < L) {
      auto& next = b.mudd[static_cast<std::size_t>(i + 1)];
      if (multiway) {
        for (int c = 0; c < 3; ++c) out[c] = next.in[c];
        out[3] = b.sub[static_cast<std::size_t>(2 * i + 2)].out;
      } else {
        out[0] = next.in[0];
      }
    }
    k::mudd_forward(da, out, m.dw, m.hidden, m.rms, b.mudd_scratch);
  }
  return b.mudd_out;
}

template <class Real>
void Model<Real>::backward_mudd(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, L = config_.n_layers;
  const bool multiway = config_.mudd_multiway(), prepost = config_.mudd_prepost_norm;
  Buffers& b = buf_;
  const int n_in = multiway ? 3 : 1;
  // b.dh holds the last DA's R gradient. (grads_, the block outputs' and PrePost sources'
  // gradients were zeroed by the caller.)
  for (int i = L - 1; i >= 0; --i) {
    auto& m = b.mudd[static_cast<std::size_t>(i)];
    Sublayer& att = b.sub[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = b.sub[static_cast<std::size_t>(2 * i + 1)];
    const SublayerActivations<Real>& att_a = bodies_.at(2 * i);
    const SublayerActivations<Real>& mlp_a = bodies_.at(2 * i + 1);
    const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(i)];
    LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(i)];

    // DA_i: its streams' gradients are complete (block i+1's inputs, or the final norm's); it
    // scatters into every source it read, which completes dX_{i+1} (later DAs ran already).
    {
      const Real* sources[k::kMaxSources];
      const k::MuddDa<Real> da = mudd_da(i, sources);
      const Real* dout[k::kMaxWays] = {b.dh};
      if (i + 1 < L) {
        for (int c = 0; c < n_in; ++c) dout[c] = b.dmudd_in[c];
        if (multiway) dout[3] = b.sub[static_cast<std::size_t>(2 * i + 2)].dout;
      }
      Real* dsources[k::kMaxSources];
      for (int j = 0; j < da.n_sources; ++j)
        dsources[j] = prepost ? b.dmudd_src[static_cast<std::size_t>(j)] : dmudd_block_output(j);
      const MuddDaWeights<Real>& gw = g_.mudd[static_cast<std::size_t>(i)];
      k::MuddGrads<Real> gr;
      gr.dout = dout;
      gr.dsources = dsources;
      gr.dx = dmudd_block_output(i + 1);
      gr.dw1 = gw.w1;
      gr.dw2 = gw.w2;
      gr.da = gw.a;
      gr.dgen_norm = gw.gen_norm;
      gr.dpost_norm = gw.post_norm;
      k::mudd_backward(da, m.dw, m.hidden, m.rms, gr, b.mudd_scratch);
    }
    if (prepost) {  // X^_{i+1}'s last reader was DA_i: through its norm, once
      const auto s = static_cast<std::size_t>(i + 1);
      k::rmsnorm_backward(b.dx, g_.mudd_src_norm[s], b.dmudd_src[s], mudd_block_output(i + 1), w_.mudd_src_norm[s],
                          b.mudd_src_rstd[s], n, d, b.reduce);
      k::add_into(dmudd_block_output(i + 1), b.dx, n * d);
    }

    // The block: the MLP's residual and sublayer into dh = att.dout, then attention.
    k::add_into(att.dout, mlp.dout, n * d);
    bodies_.mlp_backward(2 * i + 1, mlp.dout, mlp_a.x, b.dx, pass);
    k::rmsnorm_backward(b.dh, lg.mlp_norm, b.dx, att.out, lw.mlp_norm, mlp_a.rstd, n, d, b.reduce);
    k::add_into(att.dout, b.dh, n * d);
    const Real* in_q = i == 0 ? b.emb : m.in[0];
    if (multiway) {
      const auto norms = attention_norms(lw);
      const auto gnorms = attention_norms(lg);
      bodies_.attention_backward(2 * i, att.dout, att_a.x, m.xk, m.xv, b.dx, b.dxk, b.dxv, pass);
      k::rmsnorm_backward(b.dmudd_in[0], gnorms[0], b.dx, in_q, norms[0], att_a.rstd, n, d, b.reduce);
      k::rmsnorm_backward(b.dmudd_in[1], gnorms[1], b.dxk, i == 0 ? b.emb : m.in[1], norms[1], m.rstd_k, n, d,
                          b.reduce);
      k::rmsnorm_backward(b.dmudd_in[2], gnorms[2], b.dxv, i == 0 ? b.emb : m.in[2], norms[2], m.rstd_v, n, d,
                          b.reduce);
      // R's gradient is att.dout itself (h = x_R + Attn), read by DA_{i-1} there.
    } else {
      bodies_.attention_backward(2 * i, att.dout, att_a.x, att_a.x, att_a.x, b.dx, b.dx, b.dx, pass);
      k::rmsnorm_backward(b.dmudd_in[0], lg.attn_norm, b.dx, in_q, lw.attn_norm, att_a.rstd, n, d, b.reduce);
      k::add_into(b.dmudd_in[0], att.dout, n * d);  // the single stream also feeds R
    }
    if (i == 0) {  // block 0 reads the embedding on every stream
      for (int c = 0; c < n_in; ++c) k::add_into(b.demb, b.dmudd_in[c], n * d);
      if (multiway) k::add_into(b.demb, att.dout, n * d);
    }
  }
  if (prepost) {
    k::rmsnorm_backward(b.dx, g_.mudd_src_norm[0], b.dmudd_src[0], b.emb, w_.mudd_src_norm[0], b.mudd_src_rstd[0], n,
                        d, b.reduce);
    k::add_into(b.demb, b.dx, n * d);
  }
}

#define ATTNRES_MUDD_INSTANTIATIONS(Real)                                                \
  template void Model<Real>::carve_mudd(ArenaCarver<Real>&);                             \
  template const Real* Model<Real>::mudd_block_output(int) const;                        \
  template Real* Model<Real>::dmudd_block_output(int);                                   \
  template k::MuddDa<Real> Model<Real>::mudd_da(int, const Real**) const;                \
  template void Model<Real>::mudd_weights(int, int, std::int64_t, std::span<Real>) const; \
  template void Model<Real>::mudd_source_norms(int, std::int64_t, std::span<Real>) const; \
  template const Real* Model<Real>::forward_mudd(const Pass<Real>&);                     \
  template void Model<Real>::backward_mudd(const Pass<Real>&);
ATTNRES_MUDD_INSTANTIATIONS(float)
ATTNRES_MUDD_INSTANTIATIONS(double)
#undef ATTNRES_MUDD_INSTANTIATIONS

}  // namespace attnres
