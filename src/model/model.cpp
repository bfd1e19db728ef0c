#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/depth_read.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

namespace {
constexpr std::int64_t kCrossEntropyRows = 256;

// Attention in the model's matmul precision: bf16 models run the bf16 kernels (float only).
template <class Real>
void attention_forward(k::MatmulPrecision precision, Real* out, Real* lse, const Real* q, const Real* kk, const Real* v,
                       const k::AttentionShape& shape) {
  if constexpr (std::is_same_v<Real, float>)
    if (precision == k::MatmulPrecision::bf16) return k::attention_forward_bf16(out, lse, q, kk, v, shape);
  k::attention_forward(out, lse, q, kk, v, shape);
}

template <class Real>
void attention_backward(k::MatmulPrecision precision, Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q,
                        const Real* kk, const Real* v, const Real* out, const Real* lse, const k::AttentionShape& shape) {
  if constexpr (std::is_same_v<Real, float>)
    if (precision == k::MatmulPrecision::bf16)
      return k::attention_backward_bf16(dq, dk, dv, dout, q, kk, v, out, lse, shape);
  k::attention_backward(dq, dk, dv, dout, q, kk, v, out, lse, shape);
}
}  // namespace

template <class Real>
Model<Real>::Model(const ModelConfig& config, std::int64_t max_batch, int max_seq, bool with_grad)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_(max_seq),
      with_grad_(with_grad),
      topo_(config) {
  require(max_batch >= 1, "batch size must be at least 1");
  require(max_seq >= 1 && max_seq <= config.max_seq_len, "sequence length ", max_seq,
          " must be between 1 and model.max_seq_len = ", config.max_seq_len);
  params_.assign(static_cast<std::size_t>(layout_.total()), Real(0));
  w_ = bind_weights<Real>(config_, layout_, params_);
  if (with_grad_) {
    grads_.assign(static_cast<std::size_t>(layout_.total()), Real(0));
    g_ = bind_weights<Real>(config_, layout_, grads_);
  }
  buf_.sub.resize(static_cast<std::size_t>(config_.n_sublayers()));
  std::int64_t size = 0;
  carve(nullptr, size);
  arena_.assign(static_cast<std::size_t>(size), Real(0));
  std::int64_t used = 0;
  carve(arena_.data(), used);
  k::rope_tables(buf_.rope_cos, buf_.rope_sin, config_.max_seq_len, config_.head_dim(), config_.rope_theta);
  const std::int64_t bt = max_batch_ * max_seq_;
  inputs_.assign(static_cast<std::size_t>(bt), 0);
  targets_.assign(static_cast<std::size_t>(bt), 0);
  ce_row_loss_.assign(static_cast<std::size_t>(kCrossEntropyRows), 0.0);
}

template <class Real>
void Model<Real>::set_matmul_precision(k::MatmulPrecision precision) {
  require(precision == k::MatmulPrecision::fp32 || std::is_same_v<Real, float>,
          "bf16 matmuls are only available for float models (this model computes in double)");
  precision_ = precision;
}

// Lays every buffer out in the arena; with base == nullptr it only counts.
template <class Real>
void Model<Real>::carve(Real* base, std::int64_t& used) {
  auto take = [&](std::int64_t n) -> Real* {
    Real* p = base != nullptr ? base + used : nullptr;
    used += n;
    return p;
  };
  const std::int64_t bt = max_batch_ * max_seq_, d = config_.d_model, H = config_.mlp_hidden;
  const bool reads = topo_.has_reads();
  Buffers& b = buf_;
  b.emb = take(bt * d);
  for (int j = 0; j < config_.n_sublayers(); ++j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    if (reads) {
      const ReadPlan& p = topo_.read(j);
      const auto n_src = static_cast<std::int64_t>(p.sources.size());
      s.h = take(bt * d);
      s.rms = take(bt * n_src);
      s.read_logits = take(p.n_routes * bt * n_src);
    }
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
    s.out = take(bt * d);
    if (with_grad_) s.dout = take(bt * d);
  }
  if (reads) {
    const auto n_src = static_cast<std::int64_t>(topo_.read(topo_.final_read()).sources.size());
    b.h_final = take(bt * d);
    b.rms_final = take(bt * n_src);
    b.logits_final = take(bt * n_src);
  }
  b.x_final = take(bt * d);
  b.rstd_final = take(bt);
  if (topo_.any_separate_value()) b.xv = take(bt * d);
  b.dwa_out.assign(static_cast<std::size_t>(config_.n_layers + 1), nullptr);
  b.ddwa_out.assign(b.dwa_out.size(), nullptr);
  int dwa_sources = 1;
  for (const DwaPlan& p : topo_.dwas()) {
    b.dwa_out[static_cast<std::size_t>(p.block)] = take(bt * d);
    if (with_grad_) b.ddwa_out[static_cast<std::size_t>(p.block)] = take(bt * d);
    dwa_sources = std::max(dwa_sources, static_cast<int>(p.sources.size()));
  }
  const bool vres = config_.value_residual && config_.n_layers > 1;
  if (vres) b.vmix = take(bt * d);
  if (vres && with_grad_) b.dv1 = take(bt * d);
  const int half = config_.head_dim() / 2;
  b.rope_cos = take(static_cast<std::int64_t>(config_.max_seq_len) * half);
  b.rope_sin = take(static_cast<std::int64_t>(config_.max_seq_len) * half);
  b.ce_logits = take(kCrossEntropyRows * config_.vocab_size);
  if (with_grad_) {
    b.demb = take(bt * d);
    for (Real** p : {&b.dx_final, &b.dh, &b.dx, &b.dxv, &b.dq, &b.dk, &b.dv, &b.datt}) *p = take(bt * d);
    for (Real** p : {&b.dgate, &b.dup, &b.dact}) *p = take(bt * H);
    b.reduce = take(std::max({k::rmsnorm_scratch_size(bt, config_.d_model),
                              k::depth_read_scratch_size(bt, config_.d_model), k::dwa_scratch_size(bt, dwa_sources),
                              k::value_residual_scratch_size(bt)}));
  }
}

template <class Real>
void Model<Real>::set_inputs(std::span<const std::int32_t> tokens, std::int64_t batch, int seq, bool with_targets) {
  require(batch >= 1 && batch <= max_batch_, "batch size ", batch, " exceeds the model's capacity ", max_batch_);
  require(seq >= 1 && seq <= max_seq_, "sequence length ", seq, " exceeds the model's capacity ", max_seq_);
  const std::int64_t row = with_targets ? seq + 1 : seq;
  require(static_cast<std::int64_t>(tokens.size()) == batch * row, "expected ", batch * row, " tokens, got ",
          tokens.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) {
      const std::int32_t in = tokens[static_cast<std::size_t>(b * row + t)];
      require(in >= 0 && in < config_.vocab_size, "token id ", in, " is outside the vocabulary [0, ",
              config_.vocab_size, ")");
      inputs_[static_cast<std::size_t>(b * seq + t)] = in;
      if (with_targets) {
        const std::int32_t out = tokens[static_cast<std::size_t>(b * row + t + 1)];
        require(out >= 0 && out < config_.vocab_size, "token id ", out, " is outside the vocabulary [0, ",
                config_.vocab_size, ")");
        targets_[static_cast<std::size_t>(b * seq + t)] = out;
      }
    }
  n_tok_ = batch * seq;
}

template <class Real>
const Real* Model<Real>::residual(int index) const {
  if (index == kNoStream) return nullptr;
  if (topo_.is_dwa_stream(index)) return buf_.dwa_out[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
  return index == kEmbedding ? buf_.emb : buf_.sub[static_cast<std::size_t>(index)].out;
}

template <class Real>
Real* Model<Real>::dresidual(int index) {
  if (index == kNoStream) return nullptr;
  if (topo_.is_dwa_stream(index)) return buf_.ddwa_out[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
  return index == kEmbedding ? buf_.demb : buf_.sub[static_cast<std::size_t>(index)].dout;
}

template <class Real>
k::DepthRead<Real> Model<Real>::depth_read(int j, const ModelWeights<Real>& w, const Real** sources) const {
  const ReadPlan& plan = topo_.read(j);
  const ReadParams<Real> p = read_params(w, topo_, j);
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  k::DepthRead<Real> rd;
  rd.sources = sources;
  rd.n_sources = static_cast<int>(plan.sources.size());
  rd.n_tok = n_tok_;
  rd.d = config_.d_model;
  rd.eps = static_cast<Real>(config_.norm_eps);
  rd.gamma = p.key_norm;
  rd.n_routes = plan.n_routes;
  rd.queries[0] = p.query;
  rd.queries[1] = p.value_query;
  rd.average = plan.average;
  rd.out_norm[1] = p.value_norm;
  return rd;
}

template <class Real>
void Model<Real>::run_read(int j, Real* out, Real* xv, Real* rms, Real* logits) {
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, w_, sources);
  Real* outs[k::kMaxRoutes] = {out, xv};
  k::depth_read_forward(rd, outs, rms, logits);
}

template <class Real>
void Model<Real>::run_read_backward(int j, const Real* dout, const Real* dxv, const Real* rms, const Real* logits,
                                    Real* xv) {
  const ReadPlan& plan = topo_.read(j);
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, w_, sources);
  const ReadParams<Real> pg = read_params(g_, topo_, j);
  Real* dsources[k::kMaxSources];
  for (std::size_t s = 0; s < plan.sources.size(); ++s) dsources[s] = dresidual(plan.sources[s]);
  k::DepthReadGrads<Real> gr;
  gr.dout[0] = dout;
  gr.dout[1] = dxv;
  gr.dsources = dsources;
  gr.dqueries[0] = pg.query;
  gr.dqueries[1] = pg.value_query;
  gr.dgamma = pg.key_norm;
  gr.dout_norm[1] = pg.value_norm;
  gr.out[1] = xv;
  k::depth_read_backward(rd, rms, logits, gr, buf_.reduce);
}

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
k::Dwa<Real> Model<Real>::dwa(const DwaPlan& plan, const Real** sources) const {
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  const auto index = static_cast<std::size_t>(&plan - topo_.dwas().data());
  k::Dwa<Real> dwa;
  dwa.sources = sources;
  dwa.n_sources = static_cast<int>(plan.sources.size());
  dwa.n_tok = n_tok_;
  dwa.d = config_.d_model;
  dwa.alpha = w_.dwa_alpha[index];
  return dwa;
}

template <class Real>
void Model<Real>::forward_trunk(std::int64_t batch, int seq, KvCache<Real>* cache) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
  const Real eps = static_cast<Real>(config_.norm_eps);
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  k::embedding_forward(buf_.emb, inputs_.data(), w_.tok_emb, n, d);
  const int pos0 = cache != nullptr ? cache->length : 0;
  const k::AttentionShape shape{batch, seq, cache != nullptr ? cache->max_seq : seq, config_.n_heads,
                                config_.head_dim(), pos0};
  for (int j = 0; j < L; ++j) {
    Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
    const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
    const bool attn = is_attention(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (reads) run_read(j, s.h, separate ? buf_.xv : nullptr, s.rms, s.read_logits);
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_forward(s.x, s.rstd, h, input_norm(w_, L, j), n, d, eps);
    const Real* base = residual(topo_.write_base(j));
    if (base != nullptr) k::copy(s.out, base, n * d);
    if (attn) {
      k::linear_forward(s.q, s.x, lw.wq, n, d, d, false, precision_);
      k::linear_forward(s.k, s.x, lw.wk, n, d, d, false, precision_);
      k::linear_forward(s.v, separate ? buf_.xv : s.x, lw.wv, n, d, d, false, precision_);
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
        attention_forward(precision_, s.att, s.lse, s.q, kc, vc, shape);
      } else {
        attention_forward(precision_, s.att, s.lse, s.q, s.k, v, shape);
      }
      k::linear_forward(s.out, s.att, lw.wo, n, d, d, base != nullptr, precision_);
    } else {
      k::linear_forward(s.gate, s.x, lw.w_gate, n, d, H, false, precision_);
      k::linear_forward(s.up, s.x, lw.w_up, n, d, H, false, precision_);
      k::swiglu_forward(s.act, s.gate, s.up, n * H);
      k::linear_forward(s.out, s.act, lw.w_down, n, H, d, base != nullptr, precision_);
      if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
        const Real* sources[k::kMaxSources];
        k::dwa_forward(dwa(*plan, sources), buf_.dwa_out[static_cast<std::size_t>(plan->block)]);
      }
    }
  }
  if (reads) run_read(topo_.final_read(), buf_.h_final, nullptr, buf_.rms_final, buf_.logits_final);
  const Real* h_final = reads ? buf_.h_final : residual(topo_.input(L));
  k::rmsnorm_forward(buf_.x_final, buf_.rstd_final, h_final, w_.final_norm, n, d, eps);
}

template <class Real>
void Model<Real>::backward_trunk(std::int64_t batch, int seq) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  const k::AttentionShape shape{batch, seq, seq, config_.n_heads, config_.head_dim(), 0};
  Buffers& b = buf_;

  // Final read and norm. (grads_ and the activation gradients were zeroed by the caller.)
  const Real* h_final = reads ? b.h_final : residual(topo_.input(L));
  k::rmsnorm_backward(b.dh, g_.final_norm, b.dx_final, h_final, w_.final_norm, b.rstd_final, n, d, b.reduce);
  if (reads) {
    run_read_backward(topo_.final_read(), b.dh, nullptr, b.rms_final, b.logits_final, nullptr);
  } else {
    k::add_into(dresidual(topo_.input(L)), b.dh, n * d);
  }

  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    const LayerWeights<Real>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
    LayerWeights<Real>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
    const bool attn = is_attention(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
      // The DWA's output gradient is complete (its readers lie in later blocks); scattering it
      // completes s.dout, the gradient of this block's output, as every DWA reading it is later.
      const Real* sources[k::kMaxSources];
      Real* dsources[k::kMaxSources];
      for (std::size_t i = 0; i < plan->sources.size(); ++i) dsources[i] = dresidual(plan->sources[i]);
      const auto index = static_cast<std::size_t>(plan - topo_.dwas().data());
      k::dwa_backward(dwa(*plan, sources), dresidual(plan->output), dsources, g_.dwa_alpha[index], b.reduce);
    }
    // s.dout is complete: every later user of this partial sum has been visited.
    if (Real* dbase = dresidual(topo_.write_base(j))) k::add_into(dbase, s.dout, n * d);
    if (attn) {
      k::linear_backward_weight(lg.wo, s.dout, s.att, n, d, d, precision_);
      k::linear_backward_input(b.datt, s.dout, lw.wo, n, d, d, false, precision_);
      const auto vr = value_residual(layer_of(j));
      if (vr) k::value_residual_forward(*vr, b.vmix);  // V' again, bit for bit
      attention_backward(precision_, b.dq, b.dk, b.dv, b.datt, s.q, s.k, vr ? b.vmix : s.v, s.att, s.lse, shape);
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
      k::linear_backward_weight(lg.wq, b.dq, s.x, n, d, d, precision_);
      k::linear_backward_weight(lg.wk, b.dk, s.x, n, d, d, precision_);
      if (!separate) k::linear_backward_weight(lg.wv, b.dv, s.x, n, d, d, precision_);  // RD's: after its read
      k::linear_backward_input(b.dx, b.dq, lw.wq, n, d, d, false, precision_);
      k::linear_backward_input(b.dx, b.dk, lw.wk, n, d, d, true, precision_);
      if (separate) k::linear_backward_input(b.dxv, b.dv, lw.wv, n, d, d, false, precision_);
      else k::linear_backward_input(b.dx, b.dv, lw.wv, n, d, d, true, precision_);
    } else {
      k::linear_backward_weight(lg.w_down, s.dout, s.act, n, H, d, precision_);
      k::linear_backward_input(b.dact, s.dout, lw.w_down, n, H, d, false, precision_);
      k::swiglu_backward(b.dgate, b.dup, b.dact, s.gate, s.up, n * H);
      k::linear_backward_weight(lg.w_gate, b.dgate, s.x, n, d, H, precision_);
      k::linear_backward_weight(lg.w_up, b.dup, s.x, n, d, H, precision_);
      k::linear_backward_input(b.dx, b.dgate, lw.w_gate, n, d, H, false, precision_);
      k::linear_backward_input(b.dx, b.dup, lw.w_up, n, d, H, true, precision_);
    }
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_backward(b.dh, input_norm(g_, L, j), b.dx, h, input_norm(w_, L, j), s.rstd, n, d, b.reduce);
    if (reads) {
      // RD's value route: the read's backward takes dxv through the fused norm and recomputes
      // the normalised input xv on the way (bit for bit) into dxv's buffer, row by row as dxv
      // is consumed (no separate buffer to fetch), which Wv's gradient then reads.
      run_read_backward(j, b.dh, separate ? b.dxv : nullptr, s.rms, s.read_logits, separate ? b.dxv : nullptr);
      if (separate) k::linear_backward_weight(lg.wv, b.dv, b.dxv, n, d, d, precision_);
    } else {
      k::add_into(dresidual(topo_.input(j)), b.dh, n * d);
    }
  }
  k::embedding_backward(g_.tok_emb, inputs_.data(), b.demb, n, d);
}

template <class Real>
double Model<Real>::forward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  set_inputs(tokens, batch, seq, true);
  forward_trunk(batch, seq);
  const k::CrossEntropyScratch<Real> ce{buf_.ce_logits, ce_row_loss_.data(), kCrossEntropyRows};
  const double total = k::lm_head_cross_entropy<Real>(buf_.x_final, w_.lm_head, targets_.data(), n_tok_,
                                                      config_.d_model, config_.vocab_size, ce, Real(0), nullptr,
                                                      nullptr, precision_);
  return total / static_cast<double>(n_tok_);
}

template <class Real>
double Model<Real>::forward_backward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  require(with_grad_, "this model was built without gradient buffers");
  set_inputs(tokens, batch, seq, true);
  forward_trunk(batch, seq);
  const std::int64_t n = n_tok_, d = config_.d_model;
  std::fill(grads_.begin(), grads_.end(), Real(0));
  k::zero(buf_.demb, n * d);
  for (Sublayer& s : buf_.sub) k::zero(s.dout, n * d);
  for (Real* g : buf_.ddwa_out)
    if (g != nullptr) k::zero(g, n * d);
  if (buf_.dv1 != nullptr) k::zero(buf_.dv1, n * d);
  const k::CrossEntropyScratch<Real> ce{buf_.ce_logits, ce_row_loss_.data(), kCrossEntropyRows};
  const double total = k::lm_head_cross_entropy<Real>(buf_.x_final, w_.lm_head, targets_.data(), n, config_.d_model,
                                                      config_.vocab_size, ce, Real(1) / static_cast<Real>(n),
                                                      buf_.dx_final, g_.lm_head, precision_);
  backward_trunk(batch, seq);
  return total / static_cast<double>(n);
}

template <class Real>
void Model<Real>::logits(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, std::span<Real> out) {
  set_inputs(inputs, batch, seq, false);
  require(static_cast<std::int64_t>(out.size()) == n_tok_ * config_.vocab_size, "logits buffer has the wrong size");
  forward_trunk(batch, seq);
  k::linear_forward(out.data(), buf_.x_final, w_.lm_head, n_tok_, config_.d_model, config_.vocab_size, false,
                    precision_);
}

template <class Real>
void Model<Real>::decode(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, KvCache<Real>& cache,
                         std::span<Real> out) {
  require(batch == cache.batch, "decode: the cache was made for batch ", cache.batch);
  require(cache.length + seq <= cache.max_seq && cache.max_seq <= config_.max_seq_len,
          "the context is full (", cache.max_seq, " tokens)");
  require(static_cast<std::int64_t>(out.size()) == batch * config_.vocab_size, "logits buffer has the wrong size");
  set_inputs(inputs, batch, seq, false);
  forward_trunk(batch, seq, &cache);
  cache.length += seq;
  for (std::int64_t b = 0; b < batch; ++b)
    k::linear_forward(out.data() + b * config_.vocab_size, buf_.x_final + ((b + 1) * seq - 1) * config_.d_model,
                      w_.lm_head, 1, config_.d_model, config_.vocab_size, false, precision_);
}

template <class Real>
void Model<Real>::read_weights(int read, int route, std::int64_t token, std::span<Real> alpha) const {
  require(read >= 0 && read <= topo_.final_read() && topo_.has_reads(), "the model has no depth read ", read);
  const ReadPlan& plan = topo_.read(read);
  const int n = static_cast<int>(plan.sources.size());
  require(route >= 0 && route < plan.n_routes, "read ", read, " has no route ", route);
  require(token >= 0 && token < n_tok_, "token index out of range");
  require(static_cast<int>(alpha.size()) == n, "alpha buffer has the wrong size");
  const Real* logits = read == topo_.final_read()
                           ? buf_.logits_final
                           : buf_.sub[static_cast<std::size_t>(read)].read_logits;
  const bool uniform = route == 1 && plan.uniform_value;
  k::depth_weights(logits + (route * n_tok_ + token) * n, n, uniform, alpha.data());
}

template class Model<float>;
template class Model<double>;

}  // namespace attnres
