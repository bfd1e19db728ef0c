// CudaModel's MUDDFormer trunk (baselines-spec §2; the CPU's model/mudd_trunk.cpp, step for step):
// block b reads four streams, Q, K and V through three pre-norms (or one stream, mudd_ways = r),
// h = x_R + Attn, X_{b+1} = h + MLP(RMSNorm(h)); the DA module after it mixes X_0..X_{b+1} into
// the next block's streams with per-token weights from a generator on X_{b+1}. The generator's
// GEMMs run through cuBLASLt in fp32 in either precision (the DA modules are depth mixes, which
// stay fp32 as the depth reads do); its norm, GELU and the mix are mudd.cu's kernels.
//
// Buffers: sub[2b].out holds h (the DA before block b writes x_R straight into it), sub[2b+1].out
// the block output X_{b+1}, their douts the gradients (zeroed with demb by forward_backward);
// MuddState the blocks' Q, K, V inputs, the normalised K and V inputs, each DA's saved dw, hidden
// and RMS factor, PrePostDANorm's normalised sources, the last DA's output and the gradients.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "model/mudd_trunk.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

struct CudaModel::MuddState {
  // Block b's buffers (model/mudd_trunk.hpp's Block): the raw inputs of its Q, K and V norms (block
  // 0 reads the embedding; mudd_ways = r: in[0] only), the normalised K and V inputs and their RMS
  // factors, and the DA after it: dw (a included), the generator's pre-GELU hidden and its input's
  // RMS factor (dynamic only).
  struct Block {
    float* in[3] = {nullptr, nullptr, nullptr};
    void *xk = nullptr, *xv = nullptr;
    float *rstd_k = nullptr, *rstd_v = nullptr;
    float *dw = nullptr, *hidden = nullptr, *rms = nullptr;
  };
  std::vector<mudd::DaWeights<float>> w, g;  // by DA module (device pointers)
  std::vector<float*> src_norm_w, src_norm_g;  // PrePostDANorm: X_0..X_L's norms
  std::vector<float*> k_norm_w, k_norm_g, v_norm_w, v_norm_g;  // by block (qkvr, mudd_sep_qkv_norm)
  std::vector<Block> blocks;
  std::vector<float*> src, src_rstd, dsrc;  // PrePostDANorm: X^_0..X^_L, their factors, gradients
  float* out = nullptr;                     // the last DA's R stream: the final norm's input
  float* scratch = nullptr;                 // a DA's (mudd_scratch)
  float* din[3] = {nullptr, nullptr, nullptr};  // gradients of a block's Q, K, V inputs
  float *dxk = nullptr, *dxv = nullptr;         // attention's K and V input gradients (qkvr)

  // The block output X_j (X_0: the embedding) and its gradient.
  static const float* block_output(const CudaModel& m, int j) {
    return j == 0 ? m.buf_.emb : m.buf_.sub[static_cast<std::size_t>(2 * j - 1)].out;
  }
  static float* dblock_output(CudaModel& m, int j) {
    return j == 0 ? m.buf_.demb : m.buf_.sub[static_cast<std::size_t>(2 * j - 1)].dout;
  }
  // DA i's mix (its sources, ways, static weights and post norm; out unset).
  kern::MuddMix mix(const CudaModel& m, int i) const {
    const ModelConfig& c = m.config_;
    kern::MuddMix a;
    a.n_sources = c.mudd_da_sources(i);
    for (int j = 0; j < a.n_sources; ++j)
      a.sources[j] = c.mudd_prepost_norm ? src[static_cast<std::size_t>(j)] : block_output(m, j);
    a.n_ways = c.mudd_da_ways(i);
    a.n_tok = m.n_tok_;
    a.d = c.d_model;
    a.eps = static_cast<float>(c.norm_eps);
    a.x = block_output(m, i + 1);
    a.a = w[static_cast<std::size_t>(i)].a;
    a.post_norm = w[static_cast<std::size_t>(i)].post_norm;
    return a;
  }
  // The scratch floats of a DA with C ways over S sources and generator width K (0: static).
  static std::int64_t scratch_floats(std::int64_t n_tok, int d, int C, int S, int K) {
    return n_tok * (d + K + std::int64_t(C) * S) + kern::mudd_mix_scratch_floats(n_tok, d, C, S);
  }

  // DA i forward: the streams into out[0..C).
  void da_forward(CudaModel& m, int i, float* const* out) {
    const ModelConfig& c = m.config_;
    const Block& b = blocks[static_cast<std::size_t>(i)];
    const mudd::DaWeights<float>& wi = w[static_cast<std::size_t>(i)];
    kern::MuddMix a = mix(m, i);
    for (int k = 0; k < a.n_ways; ++k) a.out[k] = out[k];
    if (!c.mudd_dynamic) {
      kern::mudd_mix_forward(a, nullptr, m.stream_);
      return;
    }
    const std::int64_t n = m.n_tok_;
    const int d = c.d_model, K = c.mudd_da_hidden(i), cs = a.n_ways * a.n_sources;
    float* normed = scratch;
    float* act = normed + n * d;
    kern::rmsnorm_forward(normed, DType::f32, b.rms, a.x, wi.gen_norm, n, d, a.eps, m.stream_);
    m.gemm_->linear_forward(b.hidden, DType::f32, normed, wi.w1, DType::f32, n, d, K);
    kern::mudd_gelu(act, b.hidden, n * K, c.mudd_gelu, m.stream_);
    m.gemm_->linear_forward(b.dw, DType::f32, act, wi.w2, DType::f32, n, K, cs);
    kern::mudd_mix_forward(a, b.dw, m.stream_);
  }

  // DA i backward given its streams' gradients dout[0..C): into the sources' (and, through the
  // generator, X_{i+1}'s) gradients and the DA's parameter gradients.
  void da_backward(CudaModel& m, int i, const float* const* dout) {
    const ModelConfig& c = m.config_;
    const Block& b = blocks[static_cast<std::size_t>(i)];
    const mudd::DaWeights<float>& wi = w[static_cast<std::size_t>(i)];
    const mudd::DaWeights<float>& gi = g[static_cast<std::size_t>(i)];
    const kern::MuddMix a = mix(m, i);
    kern::MuddMixGrads gr;
    for (int k = 0; k < a.n_ways; ++k) gr.dout[k] = dout[k];
    for (int j = 0; j < a.n_sources; ++j)
      gr.dsources[j] = c.mudd_prepost_norm ? dsrc[static_cast<std::size_t>(j)] : dblock_output(m, j);
    float* dx = dblock_output(m, i + 1);
    gr.dx = dx;
    gr.da = gi.a;
    gr.dpost_norm = gi.post_norm;
    const std::int64_t n = m.n_tok_;
    const int d = c.d_model, K = c.mudd_dynamic ? c.mudd_da_hidden(i) : 0, cs = a.n_ways * a.n_sources;
    float* normed = scratch;
    float* act = normed + n * d;
    float* delta = act + n * K;
    float* reduce = delta + n * cs;
    if (!c.mudd_dynamic) {
      kern::mudd_mix_backward(a, nullptr, gr, nullptr, reduce, m.stream_);
      return;
    }
    kern::mudd_mix_backward(a, b.dw, gr, delta, reduce, m.stream_);
    // The generator: dW2 += delta^T GELU(h); dh = (delta W2) GELU'(h); dW1 += dh^T n; dn = dh W1;
    // then its input norm's backward into dx.
    kern::mudd_gelu(act, b.hidden, n * K, c.mudd_gelu, m.stream_);
    m.gemm_->linear_backward_weight(gi.w2, delta, act, DType::f32, n, K, cs);
    m.gemm_->linear_backward_input(act, DType::f32, delta, wi.w2, DType::f32, n, K, cs);
    kern::mudd_gelu_backward(act, b.hidden, n * K, c.mudd_gelu, m.stream_);
    kern::rmsnorm_forward(normed, DType::f32, b.rms, a.x, wi.gen_norm, n, d, a.eps, m.stream_);  // as the forward's
    m.gemm_->linear_backward_weight(gi.w1, act, normed, DType::f32, n, d, K);
    m.gemm_->linear_backward_input(normed, DType::f32, act, wi.w1, DType::f32, n, d, K);
    kern::rmsnorm_backward(dx, true, gi.gen_norm, normed, a.x, wi.gen_norm, b.rms, n, d, reduce, m.stream_);
  }
};

void CudaModel::mudd_init() {
  require(config_.mudd_da_sources(config_.n_layers - 1) <= kern::kMuddMaxSources,
          "the CUDA backend's MUDD supports model.n_layers up to ", kern::kMuddMaxSources - 1);
  auto M = std::make_shared<MuddState>();
  const std::span<float> params(params_.as<float>(), layout_.total());
  const std::span<float> grads = with_grad_ ? std::span<float>(grads_.as<float>(), layout_.total()) : std::span<float>();
  const int L = config_.n_layers;
  M->w = mudd::bind_da_modules(config_, layout_, params);
  M->g = mudd::bind_da_modules(config_, layout_, grads);
  M->src_norm_w = mudd::bind_each(layout_, params, "mudd.src_norm.", L + 1, ".weight");
  M->src_norm_g = mudd::bind_each(layout_, grads, "mudd.src_norm.", L + 1, ".weight");
  M->k_norm_w = mudd::bind_each(layout_, params, "layers.", L, ".attn_norm_k.weight");
  M->k_norm_g = mudd::bind_each(layout_, grads, "layers.", L, ".attn_norm_k.weight");
  M->v_norm_w = mudd::bind_each(layout_, params, "layers.", L, ".attn_norm_v.weight");
  M->v_norm_g = mudd::bind_each(layout_, grads, "layers.", L, ".attn_norm_v.weight");
  mudd_ = std::move(M);
}

void CudaModel::mudd_carve(const std::function<float*(std::int64_t)>& f32,
                           const std::function<void*(std::int64_t)>& op) {
  MuddState& M = *mudd_;
  const ModelConfig& c = config_;
  const std::int64_t bt = max_batch_ * max_seq_, d = c.d_model;
  const int L = c.n_layers;
  const bool multiway = c.mudd_multiway();
  M.blocks.assign(static_cast<std::size_t>(L), {});
  std::int64_t scratch = 0;
  for (int i = 0; i < L; ++i) {
    MuddState::Block& b = M.blocks[static_cast<std::size_t>(i)];
    if (i > 0)
      for (int k = 0; k < (multiway ? 3 : 1); ++k) b.in[k] = f32(bt * d);
    if (multiway) {
      b.xk = op(bt * d);
      b.xv = op(bt * d);
      b.rstd_k = f32(bt);
      b.rstd_v = f32(bt);
    }
    const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i), K = c.mudd_dynamic ? c.mudd_da_hidden(i) : 0;
    if (c.mudd_dynamic) {
      b.dw = f32(bt * C * S);
      b.hidden = f32(bt * K);
      b.rms = f32(bt);
    }
    scratch = std::max(scratch, MuddState::scratch_floats(bt, c.d_model, C, S, K));
  }
  M.src.clear();
  M.src_rstd.clear();
  M.dsrc.clear();
  if (c.mudd_prepost_norm)
    for (int j = 0; j <= L; ++j) {
      M.src.push_back(f32(bt * d));
      M.src_rstd.push_back(f32(bt));
      if (with_grad_) M.dsrc.push_back(f32(bt * d));
    }
  M.out = f32(bt * d);
  M.scratch = f32(scratch);
  for (float*& g : M.din) g = nullptr;
  M.dxk = M.dxv = nullptr;
  if (with_grad_) {
    for (int k = 0; k < (multiway ? 3 : 1); ++k) M.din[k] = f32(bt * d);
    if (multiway) {
      M.dxk = f32(bt * d);
      M.dxv = f32(bt * d);
    }
  }
}

void CudaModel::mudd_forward_trunk(std::int64_t batch, int seq) {
  refresh_shadow();
  MuddState& M = *mudd_;
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, L = config_.n_layers;
  const float eps = static_cast<float>(config_.norm_eps);
  const bool multiway = config_.mudd_multiway(), prepost = config_.mudd_prepost_norm;
  const DType ot = op_type();
  const kern::AttentionShape shape{batch, seq, config_.n_heads, config_.head_dim()};
  kern::embedding_forward(buf_.emb, buf_.tokens, w_.tok_emb, n, d, stream_);
  if (prepost) kern::rmsnorm_forward(M.src[0], DType::f32, M.src_rstd[0], buf_.emb, M.src_norm_w[0], n, d, eps, stream_);
  for (int i = 0; i < L; ++i) {
    MuddState::Block& m = M.blocks[static_cast<std::size_t>(i)];
    Sublayer& att = buf_.sub[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = buf_.sub[static_cast<std::size_t>(2 * i + 1)];
    const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(i)];
    // The block: Q, K, V through their norms, h = x_R + Attn (x_R: the embedding at block 0 and
    // the single stream with mudd_ways = r, else what the DA wrote into att.out).
    const float* in_q = i == 0 ? buf_.emb : m.in[0];
    kern::rmsnorm_forward(att.x, ot, att.rstd, in_q, lw.attn_norm, n, d, eps, stream_);
    const void *xk = att.x, *xv = att.x;
    if (multiway) {
      const auto norms = mudd::attention_norms(i, w_, M.k_norm_w, M.v_norm_w);
      kern::rmsnorm_forward(m.xk, ot, m.rstd_k, i == 0 ? buf_.emb : m.in[1], norms[1], n, d, eps, stream_);
      kern::rmsnorm_forward(m.xv, ot, m.rstd_v, i == 0 ? buf_.emb : m.in[2], norms[2], n, d, eps, stream_);
      xk = m.xk;
      xv = m.xv;
    }
    gemm_->linear_forward(att.q, ot, att.x, op_weight(lw.wq), ot, n, d, d);
    gemm_->linear_forward(att.k, ot, xk, op_weight(lw.wk), ot, n, d, d);
    gemm_->linear_forward(att.v, ot, xv, op_weight(lw.wv), ot, n, d, d);
    kern::rope(att.q, att.k, ot, n, seq, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin, false,
               stream_);
    const void* v = att.v;
    if (const auto vr = value_residual(i)) {
      kern::value_residual_forward(*vr, buf_.vmix, stream_);
      v = buf_.vmix;
    }
    attention_->forward(att.att, att.lse, att.q, att.k, v, ot, shape);
    const float* x_r = i == 0 || !multiway ? in_q : att.out;
    gemm_->linear_forward(att.out, DType::f32, att.att, op_weight(lw.wo), ot, n, d, d, x_r);
    kern::rmsnorm_forward(mlp.x, ot, mlp.rstd, att.out, lw.mlp_norm, n, d, eps, stream_);
    mlp_forward(lw, mlp, mlp.out, att.out, n);
    if (prepost)
      kern::rmsnorm_forward(M.src[static_cast<std::size_t>(i + 1)], DType::f32,
                            M.src_rstd[static_cast<std::size_t>(i + 1)], mlp.out,
                            M.src_norm_w[static_cast<std::size_t>(i + 1)], n, d, eps, stream_);
    // The DA after the block: the next block's streams (Q, K, V into its in[], R into its
    // attention's out), or the model's output.
    float* out[kernels::kMaxWays] = {M.out};
    if (i + 1 < L) {
      MuddState::Block& next = M.blocks[static_cast<std::size_t>(i + 1)];
      for (int k = 0; k < (multiway ? 3 : 1); ++k) out[k] = next.in[k];
      if (multiway) out[3] = buf_.sub[static_cast<std::size_t>(2 * i + 2)].out;
    }
    M.da_forward(*this, i, out);
  }
  kern::rmsnorm_forward(buf_.x_final, ot, buf_.rstd_final, M.out, w_.final_norm, n, d, eps, stream_);
}

void CudaModel::mudd_backward_trunk(std::int64_t batch, int seq) {
  MuddState& M = *mudd_;
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, L = config_.n_layers;
  const bool multiway = config_.mudd_multiway(), prepost = config_.mudd_prepost_norm;
  const int n_in = multiway ? 3 : 1;
  const DType ot = op_type();
  const bool bf16 = ot == DType::bf16;
  const kern::AttentionShape shape{batch, seq, config_.n_heads, config_.head_dim()};
  Buffers& b = buf_;
  for (float* g : M.dsrc) ATTNRES_CUDA_CHECK(cudaMemsetAsync(g, 0, sizeof(float) * static_cast<std::size_t>(n * d), stream_));
  // b.dh: the last DA's R gradient (grads and the douts were zeroed by the caller).
  kern::rmsnorm_backward(b.dh, false, g_.final_norm, b.dx_final, M.out, w_.final_norm, b.rstd_final, n, d, b.reduce,
                         stream_);
  for (int i = L - 1; i >= 0; --i) {
    const MuddState::Block& m = M.blocks[static_cast<std::size_t>(i)];
    Sublayer& att = b.sub[static_cast<std::size_t>(2 * i)];
    Sublayer& mlp = b.sub[static_cast<std::size_t>(2 * i + 1)];
    const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(i)];
    LayerWeights<float>& lg = g_.layers[static_cast<std::size_t>(i)];
    // DA_i: its streams' gradients are complete (block i+1's inputs, or the final norm's); it
    // scatters into every source it read, which completes dX_{i+1} (later DAs ran already).
    const float* dout[kernels::kMaxWays] = {b.dh};
    if (i + 1 < L) {
      for (int k = 0; k < n_in; ++k) dout[k] = M.din[k];
      if (multiway) dout[3] = b.sub[static_cast<std::size_t>(2 * i + 2)].dout;
    }
    M.da_backward(*this, i, dout);
    if (prepost) {  // X^_{i+1}'s last reader was DA_i: through its norm, once
      const auto s = static_cast<std::size_t>(i + 1);
      kern::rmsnorm_backward(mlp.dout, true, M.src_norm_g[s], M.dsrc[s], mlp.out, M.src_norm_w[s], M.src_rstd[s], n,
                             d, b.reduce, stream_);
    }
    // The MLP: its residual into dh = att.dout, then the sublayer and its norm.
    const void* dy = mlp.dout;
    if (bf16) {
      kern::add_and_cast(att.dout, mlp.dout, b.dout_op, n * d, stream_);
      dy = b.dout_op;
    } else {
      kern::add_into(att.dout, mlp.dout, n * d, stream_);
    }
    mlp_backward(lw, lg, mlp, dy, n);
    kern::rmsnorm_backward(att.dout, true, lg.mlp_norm, b.dx, att.out, lw.mlp_norm, mlp.rstd, n, d, b.reduce, stream_);
    // Attention: att.dout is dL/dh, also x_R's gradient (read by DA_{i-1} there).
    dy = att.dout;
    if (bf16) {
      kern::add_and_cast(nullptr, att.dout, b.dout_op, n * d, stream_);
      dy = b.dout_op;
    }
    gemm_->linear_backward_weight(lg.wo, dy, att.att, ot, n, d, d);
    gemm_->linear_backward_input(b.datt, ot, dy, op_weight(lw.wo), ot, n, d, d);
    const auto vr = value_residual(i);
    if (vr) kern::value_residual_forward(*vr, b.vmix, stream_);  // V' again, bit for bit
    attention_->backward(b.dq, b.dk, b.dv, b.datt, att.q, att.k, vr ? b.vmix : att.v, att.att, att.lse, b.delta, ot,
                         shape);
    if (vr) {
      kern::value_residual_backward(*vr, b.dv, b.dv1, lg.vres_lambda, b.reduce, stream_);
    } else if (i == 0 && b.dv1 != nullptr) {
      kern::add_fp32(b.dv, ot, b.dv1, n * d, stream_);
    }
    kern::rope(b.dq, b.dk, ot, n, seq, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin, true, stream_);
    const void* xk = multiway ? m.xk : att.x;
    const void* xv = multiway ? m.xv : att.x;
    gemm_->linear_backward_weight(lg.wq, b.dq, att.x, ot, n, d, d);
    gemm_->linear_backward_weight(lg.wk, b.dk, xk, ot, n, d, d);
    gemm_->linear_backward_weight(lg.wv, b.dv, xv, ot, n, d, d);
    gemm_->linear_backward_input(b.dx, DType::f32, b.dq, op_weight(lw.wq), ot, n, d, d);
    // The input norms' backward: into DA_{i-1}'s stream gradients, or (block 0) the embedding's.
    const bool first = i == 0;
    float* const din[3] = {first ? b.demb : M.din[0], first ? b.demb : M.din[1], first ? b.demb : M.din[2]};
    const float* in_q = first ? b.emb : m.in[0];
    if (multiway) {
      gemm_->linear_backward_input(M.dxk, DType::f32, b.dk, op_weight(lw.wk), ot, n, d, d);
      gemm_->linear_backward_input(M.dxv, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d);
      const auto norms = mudd::attention_norms(i, w_, M.k_norm_w, M.v_norm_w);
      const auto gnorms = mudd::attention_norms(i, g_, M.k_norm_g, M.v_norm_g);
      kern::rmsnorm_backward(din[0], first, gnorms[0], b.dx, in_q, norms[0], att.rstd, n, d, b.reduce, stream_);
      kern::rmsnorm_backward(din[1], first, gnorms[1], M.dxk, first ? b.emb : m.in[1], norms[1], m.rstd_k, n, d,
                             b.reduce, stream_);
      kern::rmsnorm_backward(din[2], first, gnorms[2], M.dxv, first ? b.emb : m.in[2], norms[2], m.rstd_v, n, d,
                             b.reduce, stream_);
      if (first) kern::add_into(b.demb, att.dout, n * d, stream_);  // x_R = the embedding
    } else {
      gemm_->linear_backward_input(b.dx, DType::f32, b.dk, op_weight(lw.wk), ot, n, d, d, true);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d, true);
      kern::rmsnorm_backward(din[0], first, lg.attn_norm, b.dx, in_q, lw.attn_norm, att.rstd, n, d, b.reduce, stream_);
      kern::add_into(din[0], att.dout, n * d, stream_);  // the single stream also feeds R
    }
  }
  if (prepost)
    kern::rmsnorm_backward(b.demb, true, M.src_norm_g[0], M.dsrc[0], b.emb, M.src_norm_w[0], M.src_rstd[0], n, d,
                           b.reduce, stream_);
  const std::int64_t bt = max_batch_ * max_seq_;
  kern::embedding_backward(g_.tok_emb, buf_.tokens + 2 * bt, buf_.tokens + 3 * bt, buf_.tokens + 4 * bt + 1, n_ids_,
                           b.demb, d, stream_);
}

}  // namespace attnres::cuda
