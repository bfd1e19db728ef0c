// CudaModel's passes: the depth reads, the forward and backward trunks (model/model.cpp, step
// for step), the fused LM head + cross-entropy, and the public forward / forward_backward /
// logits. Construction, memory, parameters and inputs are in cuda_model.cpp.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

// ---------------------------------------------------------------------------------------------
// Depth reads
// ---------------------------------------------------------------------------------------------

void CudaModel::read_forward(int read, const ReadParams<float>& p, const float* norm_w, float* h, void* x,
                             float* rstd, float* rms, float* logits, bool recompute) {
  const ReadPlan& plan = topo_.read(read);
  kern::DepthReadForward a;
  a.sources = buf_.read_sources + static_cast<std::size_t>(read) * static_cast<std::size_t>(topo_.max_sources());
  a.n_sources = static_cast<int>(plan.sources.size());
  a.n_tok = n_tok_;
  a.d = config_.d_model;
  a.eps = static_cast<float>(config_.norm_eps);
  a.gamma = p.key_norm;
  a.n_routes = plan.n_routes;
  a.queries[0] = p.query;
  a.queries[1] = plan.n_routes > 1 && !plan.uniform_value ? p.value_query : nullptr;
  a.average = plan.average;
  a.rms = rms;
  a.logits = logits;
  a.h = h;
  a.norm_w = norm_w;
  a.x = x;
  a.x_type = op_type();
  a.rstd = rstd;
  if (plan.separate_value) {
    a.hv = recompute ? buf_.hv : nullptr;
    a.xv = buf_.xv;
    a.rstdv = buf_.rstdv;
  }
  if (recompute) kern::depth_read_recompute_value(a, stream_);
  else kern::depth_read_forward(a, stream_);
}

void CudaModel::read_backward(int read, const ReadParams<float>& p, const ReadParams<float>& dp, const float* dout,
                              const float* dout_v, const float* rms, const float* logits) {
  const ReadPlan& plan = topo_.read(read);
  const std::size_t table = static_cast<std::size_t>(read) * static_cast<std::size_t>(topo_.max_sources());
  kern::DepthReadBackward a;
  a.sources = buf_.read_sources + table;
  a.dsources = buf_.read_dsources + table;
  a.n_sources = static_cast<int>(plan.sources.size());
  a.n_tok = n_tok_;
  a.d = config_.d_model;
  a.gamma = p.key_norm;
  a.n_routes = plan.n_routes;
  const bool value_has_query = plan.n_routes > 1 && !plan.uniform_value;
  a.queries[0] = p.query;
  a.queries[1] = value_has_query ? p.value_query : nullptr;
  a.average = plan.average;
  a.rms = rms;
  a.logits = logits;
  a.dout[0] = dout;
  a.dout[1] = plan.n_routes > 1 && !plan.average ? dout_v : nullptr;
  a.dqueries[0] = dp.query;
  a.dqueries[1] = value_has_query ? dp.value_query : nullptr;
  a.dgamma = dp.key_norm;
  // Issue #49: the group's shared sources get their gradients from the group's pass, after its
  // last read (the read's coefficients and partials wait in its slot).
  const ReadGroup& group = read_groups_[static_cast<std::size_t>(read_group_of_[static_cast<std::size_t>(read)])];
  const int slot = group.hi - read;
  const std::int64_t bt = max_batch_ * max_seq_;
  a.n_deferred = group.n_shared;
  a.coef = buf_.read_coef + slot * bt * topo_.max_sources() * kern::kDepthReadCoefs;
  a.scratch = buf_.read_scratch + slot * kern::depth_read_scratch_floats(bt, config_.d_model);
  kern::depth_read_backward(a, stream_);
  read_group_pending_.reads[slot] = a;
  if (read == group.lo) {
    read_group_pending_.n_reads = group.hi - group.lo + 1;
    kern::depth_read_group_backward(read_group_pending_, stream_);
  }
}

int CudaModel::read_value_slot(int read) const {
  const ReadGroup& group = read_groups_[static_cast<std::size_t>(read_group_of_[static_cast<std::size_t>(read)])];
  int slot = 0;
  for (int r = read + 1; r <= group.hi; ++r) slot += topo_.read(r).separate_value ? 1 : 0;
  return slot;
}

// Slot 0 is dh (dhv); the value route's slots count only the group's reads that have one.
float* CudaModel::read_dout(int read, bool value_route) {
  const ReadGroup& group = read_groups_[static_cast<std::size_t>(read_group_of_[static_cast<std::size_t>(read)])];
  const int slot = value_route ? read_value_slot(read) : group.hi - read;
  if (slot == 0) return value_route ? buf_.dhv : buf_.dh;
  const std::int64_t stride = max_batch_ * max_seq_ * config_.d_model;
  return (value_route ? buf_.read_dhv : buf_.read_dh) + (slot - 1) * stride;
}

// ---------------------------------------------------------------------------------------------
// The value residual (SublayerBodies::value_residual)
// ---------------------------------------------------------------------------------------------

std::optional<kern::ValueResidual> CudaModel::value_residual(int layer) const {
  if (!config_.value_residual || layer == 0) return std::nullopt;
  kern::ValueResidual a;
  a.v1 = buf_.sub[0].v;
  a.vn = buf_.sub[static_cast<std::size_t>(2 * layer)].v;
  a.type = op_type();
  a.n_tok = n_tok_;
  a.d = config_.d_model;
  a.mode = config_.vres_mode;
  a.params = w_.layers[static_cast<std::size_t>(layer)].vres_lambda;
  a.constant1 = static_cast<float>(config_.vres_lambda1);
  a.constant2 = static_cast<float>(config_.vres_lambda2);
  return a;
}

// ---------------------------------------------------------------------------------------------
// DenseFormer's DWAs
// ---------------------------------------------------------------------------------------------

kern::Dwa CudaModel::dwa(const DwaPlan& plan) const {
  const auto i = static_cast<std::size_t>(&plan - topo_.dwas().data());
  kern::Dwa a;
  a.sources = buf_.dwa_sources + dwa_table_[i];
  a.n_sources = static_cast<int>(plan.sources.size());
  a.n_tok = n_tok_;
  a.d = config_.d_model;
  a.alpha = dwa_alpha_[i];
  return a;
}

// The DWA's output gradient is complete (its readers lie in later blocks); scattering it completes
// the gradient of the block's own output, as every DWA reading that is later.
void CudaModel::dwa_backward(const DwaPlan& plan) {
  const auto i = static_cast<std::size_t>(&plan - topo_.dwas().data());
  kern::dwa_backward(dwa(plan), dresidual(plan.output), buf_.dwa_dsources + dwa_table_[i], dwa_dalpha_[i], buf_.reduce,
                     stream_);
}

// ---------------------------------------------------------------------------------------------
// Forward and backward (model/model.cpp, step for step)
// ---------------------------------------------------------------------------------------------

void CudaModel::forward_trunk(std::int64_t batch, int seq) {
  if (mudd_) return mudd_forward_trunk(batch, seq);  // MUDDFormer: cuda_model_mudd.cpp
  refresh_shadow();
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const float eps = static_cast<float>(config_.norm_eps);
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  const DType ot = op_type();
  const kern::AttentionShape shape{batch, seq, config_.n_heads, config_.head_dim()};
  kern::embedding_forward(buf_.emb, buf_.tokens, w_.tok_emb, n, d, stream_);
  for (int j = 0; j < L; ++j) {
    Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
    const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
    const bool attn = is_attention(j);
    const float* norm_w = input_norm(w_, L, j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (reads) {
      read_forward(j, read_params(w_, topo_, j), norm_w, s.h, s.x, s.rstd, s.rms, s.read_logits, false);
    } else if (delta_) {
      delta_read_forward(j, norm_w);
    } else if (gr_) {
      gr_read_forward(j);
    } else if (streams_) {  // hc / mhc: module j's read, then the pre-norm
      stream_read_forward(j, norm_w);
    } else {
      kern::rmsnorm_forward(s.x, ot, s.rstd, residual(topo_.input(j)), norm_w, n, d, eps, stream_);
    }
    // Delta AttnRes: f_j goes straight into its source at a block start; inside a block into
    // delta_f, then the source is the partial sum P_{j-1} + f_j. Its stream x_{j+1} = x_j + f_j.
    const bool delta_start = delta_ && j % config_.sublayers_per_block() == 0;
    const float* base = delta_ || gr_ || streams_ ? nullptr : residual(topo_.write_base(j));
    float* f = delta_ && !delta_start ? buf_.delta_f : s.out;
    if (attn) {
      gemm_->linear_forward(s.q, ot, s.x, op_weight(lw.wq), ot, n, d, d);
      gemm_->linear_forward(s.k, ot, s.x, op_weight(lw.wk), ot, n, d, d);
      const void* xv = separate ? buf_.xv : delta_value_input(j);  // V's own input (null: none)
      gemm_->linear_forward(s.v, ot, xv != nullptr ? xv : s.x, op_weight(lw.wv), ot, n, d, d);
      kern::rope(s.q, s.k, ot, n, seq, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin, false,
                 stream_);
      const void* v = s.v;  // the values attention uses: the raw ones, or the value residual's mix
      if (const auto vr = value_residual(layer_of(j))) {
        kern::value_residual_forward(*vr, buf_.vmix, stream_);
        v = buf_.vmix;
      }
      attention_->forward(s.att, s.lse, s.q, s.k, v, ot, shape);
      gemm_->linear_forward(f, DType::f32, s.att, op_weight(lw.wo), ot, n, d, d, base);
    } else {
      mlp_forward(lw, s, f, base, n);
      if (const DwaPlan* plan = topo_.dwa_ending_at(j))
        kern::dwa_forward(dwa(*plan), buf_.dwa_out[static_cast<std::size_t>(plan->block)], stream_);
    }
    if (delta_) {
      const auto bytes = sizeof(float) * static_cast<std::size_t>(n * d);
      if (!delta_start) {
        ATTNRES_CUDA_CHECK(cudaMemcpyAsync(s.out, buf_.sub[static_cast<std::size_t>(j - 1)].out, bytes,
                                           cudaMemcpyDeviceToDevice, stream_));
        kern::add_into(s.out, f, n * d, stream_);
      }
      float* x_next = buf_.delta_x[static_cast<std::size_t>(j)];
      ATTNRES_CUDA_CHECK(cudaMemcpyAsync(x_next, delta_stream(j), bytes, cudaMemcpyDeviceToDevice, stream_));
      kern::add_into(x_next, f, n * d, stream_);
    }
    if (gr_) gr_write_forward(j);
    if (streams_) stream_write_forward(j);  // H_{j+1} from H_j and y = s.out
  }
  if (reads) {
    read_forward(topo_.final_read(), read_params(w_, topo_, topo_.final_read()), w_.final_norm, buf_.h_final,
                 buf_.x_final, buf_.rstd_final, buf_.rms_final, buf_.logits_final, false);
  } else if (delta_) {  // no final read: the final norm reads x_L
    kern::rmsnorm_forward(buf_.x_final, ot, buf_.rstd_final, delta_stream(L), w_.final_norm, n, d, eps, stream_);
  } else if (gr_) {  // the final mixer, straight to the LM head (no final norm)
    gr_read_forward(L);
  } else if (streams_) {  // the readout of H_L, then the final norm
    stream_exit_forward();
  } else {
    kern::rmsnorm_forward(buf_.x_final, ot, buf_.rstd_final, residual(topo_.input(L)), w_.final_norm, n, d, eps,
                          stream_);
  }
}

// LM head + cross-entropy over chunks of rows (kernels/cross_entropy): logits never exist for
// the whole batch. With gradients: dx_final = dL/dx_final (scaled by 1/n) and dW_head += ...
// Enqueues the loss sum and its copy to the pinned host slot (read after a synchronize).
void CudaModel::lm_head_loss(bool with_grad) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, V = config_.vocab_size;
  const DType ot = op_type();
  const std::size_t es = dtype_size(ot);
  const void* W = op_weight(w_.lm_head);
  const float scale = 1.0f / static_cast<float>(n);
  const std::int32_t* targets = buf_.tokens + max_batch_ * max_seq_;
  for (std::int64_t r0 = 0; r0 < n; r0 += ce_rows_) {
    const std::int64_t rows = std::min(ce_rows_, n - r0);
    const void* x = static_cast<const unsigned char*>(buf_.x_final) + static_cast<std::size_t>(r0 * d) * es;
    // Issue #49: the logits in the operand type (bf16 mode: bf16, as torch.autocast's LM head
    // writes them), read with fp32 math; their gradient overwrites them, the backward GEMMs' input.
    gemm_->linear_forward(buf_.ce_logits, ot, x, W, ot, rows, d, V);
    void* dl = with_grad ? buf_.ce_logits : nullptr;
    kern::cross_entropy(buf_.ce_logits, ot, targets + r0, rows, V, buf_.row_loss + r0, dl, ot, scale, stream_);
    if (with_grad) {
      gemm_->linear_backward_input(buf_.dx_final + r0 * d, DType::f32, dl, W, ot, rows, d, V);
      gemm_->linear_backward_weight(g_.lm_head, dl, x, ot, rows, d, V);
    }
  }
  kern::sum_doubles(buf_.row_loss, n, buf_.loss, stream_);
  ATTNRES_CUDA_CHECK(
      cudaMemcpyAsync(host_loss_.as<double>(), buf_.loss, sizeof(double), cudaMemcpyDeviceToHost, stream_));
}

void CudaModel::backward_trunk(std::int64_t batch, int seq) {
  if (mudd_) return mudd_backward_trunk(batch, seq);  // MUDDFormer: cuda_model_mudd.cpp
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  const DType ot = op_type();
  const bool bf16 = ot == DType::bf16;
  const kern::AttentionShape shape{batch, seq, config_.n_heads, config_.head_dim()};
  Buffers& b = buf_;

  // Final norm and read (grads and activation gradients were zeroed by the caller).
  if (reads) {
    const int final_read = topo_.final_read();
    float* dh = read_dout(final_read, false);
    kern::rmsnorm_backward(dh, false, g_.final_norm, b.dx_final, b.h_final, w_.final_norm, b.rstd_final, n, d,
                           b.reduce, stream_);
    read_backward(final_read, read_params(w_, topo_, final_read), read_params(g_, topo_, final_read), dh, nullptr,
                  b.rms_final, b.logits_final);
  } else if (delta_) {  // dstream = dL/dx_L; then dL/dx_j on the way down
    kern::rmsnorm_backward(b.dstream, false, g_.final_norm, b.dx_final, delta_stream(L), w_.final_norm, b.rstd_final,
                           n, d, b.reduce, stream_);
  } else if (gr_) {
    gr_read_backward(L, b.dx_final);
  } else if (streams_) {  // the final norm, then every stream of H_L gets the readout's gradient
    stream_exit_backward();
  } else {
    kern::rmsnorm_backward(dresidual(topo_.input(L)), true, g_.final_norm, b.dx_final, residual(topo_.input(L)),
                           w_.final_norm, b.rstd_final, n, d, b.reduce, stream_);
  }

  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
    LayerWeights<float>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
    const bool attn = is_attention(j);
    const float* norm_w = input_norm(w_, L, j);
    float* dnorm_w = input_norm(g_, L, j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (separate) {
      // The value route's input, recomputed (bit-identical to the forward's): hv, xv, rstdv.
      read_forward(j, read_params(w_, topo_, j), norm_w, nullptr, nullptr, nullptr, s.rms, s.read_logits, true);
    }
    if (const DwaPlan* plan = topo_.dwa_ending_at(j)) dwa_backward(*plan);
    // s.dout is complete: every later user of this partial sum has been visited.
    float* dbase = delta_ || gr_ || streams_ ? nullptr : dresidual(topo_.write_base(j));
    if (gr_) gr_write_backward(j);  // s.dout = dL/dy_j
    if (streams_) stream_write_backward(j);  // s.dout = dL/dy
    if (delta_) {
      // The source's gradient is complete (its readers are later sublayers); inside a block it is
      // also the previous partial sum's. Then f_j's: the source's plus the stream's.
      if (j % config_.sublayers_per_block() != 0)
        kern::add_into(b.sub[static_cast<std::size_t>(j - 1)].dout, s.dout, n * d, stream_);
      kern::add_into(s.dout, b.dstream, n * d, stream_);
    }
    const void* dy = s.dout;
    if (bf16) {
      kern::add_and_cast(dbase, s.dout, b.dout_op, n * d, stream_);
      dy = b.dout_op;
    } else if (dbase != nullptr) {
      kern::add_into(dbase, s.dout, n * d, stream_);
    }
    if (attn) {
      gemm_->linear_backward_weight(lg.wo, dy, s.att, ot, n, d, d);
      gemm_->linear_backward_input(b.datt, ot, dy, op_weight(lw.wo), ot, n, d, d);
      const auto vr = value_residual(layer_of(j));
      if (vr) kern::value_residual_forward(*vr, b.vmix, stream_);  // V' again, bit for bit
      attention_->backward(b.dq, b.dk, b.dv, b.datt, s.q, s.k, vr ? b.vmix : s.v, s.att, s.lse, b.delta, ot, shape);
      if (vr) {
        // dv becomes the raw V's gradient; V_1's share waits in dv1 for the first layer.
        kern::value_residual_backward(*vr, b.dv, b.dv1, lg.vres_lambda, b.reduce, stream_);
      } else if (j == 0 && b.dv1 != nullptr) {
        kern::add_fp32(b.dv, ot, b.dv1, n * d, stream_);
      }
      kern::rope(b.dq, b.dk, ot, n, seq, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin, true, stream_);
      gemm_->linear_backward_weight(lg.wq, b.dq, s.x, ot, n, d, d);
      gemm_->linear_backward_weight(lg.wk, b.dk, s.x, ot, n, d, d);
      const void* xv = separate ? b.xv : delta_value_input(j);  // V's own input (null: none)
      gemm_->linear_backward_weight(lg.wv, b.dv, xv != nullptr ? xv : s.x, ot, n, d, d);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dq, op_weight(lw.wq), ot, n, d, d);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dk, op_weight(lw.wk), ot, n, d, d, true);
      if (xv != nullptr) gemm_->linear_backward_input(b.dxv, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d);
      else gemm_->linear_backward_input(b.dx, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d, true);
    } else {
      mlp_backward(lw, lg, s, dy, n);
    }
    if (reads) {
      float *dh = read_dout(j, false), *dhv = separate ? read_dout(j, true) : nullptr;
      kern::rmsnorm_backward(dh, false, dnorm_w, b.dx, s.h, norm_w, s.rstd, n, d, b.reduce, stream_);
      if (separate) kern::rmsnorm_backward(dhv, false, dnorm_w, b.dxv, b.hv, norm_w, b.rstdv, n, d, b.reduce, stream_);
      read_backward(j, read_params(w_, topo_, j), read_params(g_, topo_, j), dh, dhv, s.rms, s.read_logits);
    } else if (delta_ && !delta_src_[static_cast<std::size_t>(j)].empty()) {
      kern::rmsnorm_backward(b.dh, false, dnorm_w, b.dx, s.h, norm_w, s.rstd, n, d, b.reduce, stream_);
      delta_read_backward(j, b.dh);  // with the stream's share
    } else if (delta_) {
      kern::rmsnorm_backward(b.dstream, true, dnorm_w, b.dx, delta_stream(j), norm_w, s.rstd, n, d, b.reduce,
                             stream_);
    } else if (gr_) {
      gr_read_backward(j, b.dx);
    } else if (streams_) {  // the pre-norm, then module j's read (j = 0: and the entry)
      kern::rmsnorm_backward(b.dh, false, dnorm_w, b.dx, s.h, norm_w, s.rstd, n, d, b.reduce, stream_);
      stream_read_backward(j, b.dh);
    } else {
      kern::rmsnorm_backward(dresidual(topo_.input(j)), true, dnorm_w, b.dx, residual(topo_.input(j)), norm_w,
                             s.rstd, n, d, b.reduce, stream_);
    }
  }
  if (delta_) kern::add_into(b.demb, b.dstream, n * d, stream_);
  const std::int64_t bt = max_batch_ * max_seq_;
  kern::embedding_backward(g_.tok_emb, buf_.tokens + 2 * bt, buf_.tokens + 3 * bt, buf_.tokens + 4 * bt + 1, n_ids_,
                           b.demb, d, stream_);
}

// ---------------------------------------------------------------------------------------------
// Public passes
// ---------------------------------------------------------------------------------------------

double CudaModel::forward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  set_inputs(tokens, batch, seq, true);
  forward_trunk(batch, seq);
  lm_head_loss(false);
  synchronize();
  return *host_loss_.as<double>() / static_cast<double>(n_tok_);
}

double CudaModel::forward_backward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  require(with_grad_, "this model was built without gradient buffers");
  set_inputs(tokens, batch, seq, true);
  forward_trunk(batch, seq);
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), stream_));
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(buf_.demb, 0, sizeof(float) * buf_.dstream_floats, stream_));
  lm_head_loss(true);
  backward_trunk(batch, seq);
  synchronize();
  return *host_loss_.as<double>() / static_cast<double>(n_tok_);
}

void CudaModel::logits(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, std::span<float> out) {
  set_inputs(inputs, batch, seq, false);
  const int V = config_.vocab_size, d = config_.d_model;
  require(static_cast<std::int64_t>(out.size()) == n_tok_ * V, "logits buffer has the wrong size");
  forward_trunk(batch, seq);
  const std::size_t es = dtype_size(op_type());
  for (std::int64_t r0 = 0; r0 < n_tok_; r0 += ce_rows_) {
    const std::int64_t rows = std::min(ce_rows_, n_tok_ - r0);
    const void* x = static_cast<const unsigned char*>(buf_.x_final) + static_cast<std::size_t>(r0 * d) * es;
    gemm_->linear_forward(buf_.ce_logits, DType::f32, x, op_weight(w_.lm_head), op_type(), rows, d, V);
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(out.data() + r0 * V, buf_.ce_logits,
                                       sizeof(float) * static_cast<std::size_t>(rows * V), cudaMemcpyDeviceToHost,
                                       stream_));
    synchronize();  // ce_logits is reused by the next chunk
  }
}

void CudaModel::mlp_forward(const LayerWeights<float>& lw, const Sublayer& s, float* out, const float* base,
                            std::int64_t n) {
  const DType ot = op_type();
  const int d = config_.d_model, H = config_.mlp_hidden;
  gemm_->linear_forward(s.gate, ot, s.x, op_weight(lw.w_gate), ot, n, d, H);
  gemm_->linear_forward(s.up, ot, s.x, op_weight(lw.w_up), ot, n, d, H);
  kern::swiglu_forward(s.act, s.gate, s.up, ot, n * H, stream_);
  gemm_->linear_forward(out, DType::f32, s.act, op_weight(lw.w_down), ot, n, H, d, base);
}

void CudaModel::mlp_backward(const LayerWeights<float>& lw, LayerWeights<float>& lg, const Sublayer& s, const void* dy,
                             std::int64_t n) {
  Buffers& b = buf_;
  const DType ot = op_type();
  const int d = config_.d_model, H = config_.mlp_hidden;
  gemm_->linear_backward_weight(lg.w_down, dy, s.act, ot, n, H, d);
  gemm_->linear_backward_input(b.dact, ot, dy, op_weight(lw.w_down), ot, n, H, d);
  kern::swiglu_backward(b.dgate, b.dup, b.dact, s.gate, s.up, ot, n * H, stream_);
  gemm_->linear_backward_weight(lg.w_gate, b.dgate, s.x, ot, n, d, H);
  gemm_->linear_backward_weight(lg.w_up, b.dup, s.x, ot, n, d, H);
  gemm_->linear_backward_input(b.dx, DType::f32, b.dgate, op_weight(lw.w_gate), ot, n, d, H);
  gemm_->linear_backward_input(b.dx, DType::f32, b.dup, op_weight(lw.w_up), ot, n, d, H, true);
}

}  // namespace attnres::cuda
