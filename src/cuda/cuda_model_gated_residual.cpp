// CudaModel's Gated Residual (gr, docs/delta-gated-spec.md §2): model/gated_residual_trunk.cpp and
// kernels/gated_residual step for step. n branches per token; module j's read normalises each
// branch (its own zero-centred weight), gates them with sigmoid(W_up SiLU(W_down vec(Hn) / n)) and
// averages them into sublayer j's input (no pre-norm); its write adds beta_i y_j to branch i with
// beta = 2 sigmoid(W_inject vec(Hn) / n). The final mixer, a read without a write, feeds the LM head
// (no final norm). The three projections are cuBLASLt GEMMs (operands in the model's GEMM type,
// fp32 results); the rest is gated_residual.cu. As on the CPU, the backward recomputes Hn, SiLU(p)
// and the read gates from the saved RMS factors and p.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "model/family.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

void CudaModel::gr_bind() {
  gr_ = !has_model_norms(config_);  // the trunk that normalises its own reads: the Gated Residual
  gr_mod_.clear();
  if (!gr_) return;
  const int L = config_.n_sublayers();
  for (int j = 0; j <= L; ++j) {
    const std::string prefix = j < L ? "gr." + std::to_string(j) + "." : std::string("gr_final.");
    auto view = [&](const std::string& name, const DeviceBuffer& flat) -> float* {
      const ParamInfo* p = layout_.find(prefix + name);
      return p == nullptr || flat.data() == nullptr ? nullptr : flat.as<float>() + p->offset;
    };
    GrModule m;
    m.norm = view("norm.weight", params_);
    m.w_down = view("w_down", params_);
    m.w_up = view("w_up", params_);
    m.w_inject = view("w_inject", params_);
    m.dnorm = view("norm.weight", grads_);
    m.dw_down = view("w_down", grads_);
    m.dw_up = view("w_up", grads_);
    m.dw_inject = view("w_inject", grads_);
    require(m.norm != nullptr && m.w_down != nullptr && m.w_up != nullptr && (j == L || m.w_inject != nullptr),
            "CudaModel: the gated residual's module '", prefix, "' is missing from the layout");
    gr_mod_.push_back(m);
  }
}

void CudaModel::gr_carve(const std::function<void*(std::int64_t)>& take) {
  const std::int64_t bt = max_batch_ * max_seq_, n = config_.gr_n, nd = n * config_.d_model,
                     r = config_.gr_bottleneck(), es = static_cast<std::int64_t>(dtype_size(op_type()));
  auto f32 = [&](std::int64_t count) { return static_cast<float*>(take(4 * count)); };
  for (std::size_t j = 0; j < gr_mod_.size(); ++j) {
    GrModule& m = gr_mod_[j];
    m.H = f32(bt * nd);
    m.rms = f32(bt * n);
    m.p = f32(bt * r);
    m.beta = j + 1 < gr_mod_.size() ? f32(bt * n) : nullptr;
  }
  GrShared& s = gr_buf_;
  s = GrShared{};
  s.hn = take(es * bt * nd);
  s.a = take(es * bt * r);
  s.q = f32(bt * nd);
  if (!with_grad_) return;
  s.dq = take(es * bt * nd);
  s.dp = take(es * bt * r);
  s.ds = take(es * bt * n);
  s.dhn = f32(bt * nd);
  s.da = f32(bt * r);
  s.dH = f32(bt * nd);
}

void CudaModel::gr_read_forward(int j) {
  const int L = config_.n_sublayers(), n = config_.gr_n, d = config_.d_model, r = config_.gr_bottleneck();
  const std::int64_t T = n_tok_, nd = std::int64_t(n) * d;
  const DType ot = op_type();
  const GrModule& m = gr_mod_[static_cast<std::size_t>(j)];
  GrShared& s = gr_buf_;
  if (j == 0) kern::gr_expand(m.H, buf_.emb, T, n, d, stream_);  // every branch starts as the embedding
  kern::gr_norm(s.hn, ot, m.rms, true, m.H, m.norm, T, n, d, static_cast<float>(config_.norm_eps), stream_);
  // p = W_down vec(Hn) / n, a = SiLU(p), q = W_up a (the read gates G = sigmoid(q)).
  gemm_->linear_forward(m.p, DType::f32, s.hn, op_weight(m.w_down), ot, T, nd, r);
  kern::gr_silu(s.a, ot, m.p, T * r, 1.0f / static_cast<float>(n), stream_);
  gemm_->linear_forward(s.q, DType::f32, s.a, op_weight(m.w_up), ot, T, r, nd);
  void* x = j < L ? buf_.sub[static_cast<std::size_t>(j)].x : buf_.x_final;
  kern::gr_mix(x, ot, s.q, m.H, m.rms, m.norm, T, n, d, stream_);
  if (m.w_inject == nullptr) return;  // the final mixer: no write
  gemm_->linear_forward(m.beta, DType::f32, s.hn, op_weight(m.w_inject), ot, T, nd, n);
  kern::gr_write_gates(m.beta, T, n, stream_);
}

void CudaModel::gr_write_forward(int j) {
  const GrModule& m = gr_mod_[static_cast<std::size_t>(j)];
  kern::gr_write_forward(gr_mod_[static_cast<std::size_t>(j + 1)].H, m.H, m.beta,
                         buf_.sub[static_cast<std::size_t>(j)].out, n_tok_, config_.gr_n, config_.d_model, stream_);
}

// dL/dH_{j+1} is in gr_buf_.dH and stays there (H_{j+1} = H_j + beta y_j: the residual path is the
// identity); the write's own gradients: dy into sub[j].dout, the gates' into gr_buf_.ds.
void CudaModel::gr_write_backward(int j) {
  const Sublayer& sub = buf_.sub[static_cast<std::size_t>(j)];
  const float* beta = gr_mod_[static_cast<std::size_t>(j)].beta;
  kern::gr_write_backward(sub.dout, gr_buf_.ds, op_type(), gr_buf_.dH, sub.out, beta, n_tok_, config_.gr_n,
                          config_.d_model, stream_);
}

void CudaModel::gr_read_backward(int j, const float* dx) {
  const int L = config_.n_sublayers(), n = config_.gr_n, d = config_.d_model, r = config_.gr_bottleneck();
  const std::int64_t T = n_tok_, nd = std::int64_t(n) * d;
  const DType ot = op_type();
  const GrModule& m = gr_mod_[static_cast<std::size_t>(j)];
  GrShared& s = gr_buf_;
  if (j == L)  // the final mixer's read is the first: no later module has added into dL/dH
    ATTNRES_CUDA_CHECK(cudaMemsetAsync(s.dH, 0, sizeof(float) * static_cast<std::size_t>(T * nd), stream_));
  // Hn, SiLU(p) and q again, as the forward computed them.
  kern::gr_norm(s.hn, ot, m.rms, false, m.H, m.norm, T, n, d, 0.0f, stream_);
  kern::gr_silu(s.a, ot, m.p, T * r, 1.0f, stream_);
  gemm_->linear_forward(s.q, DType::f32, s.a, op_weight(m.w_up), ot, T, r, nd);
  // The mean and the gates: dHn = G dx / n, dq; W_up: dW_up += dq^T a, da = dq W_up; dp = da SiLU'(p) / n.
  kern::gr_gate_backward(s.dhn, s.dq, ot, s.q, dx, m.H, m.rms, m.norm, T, n, d, stream_);
  gemm_->linear_backward_weight(m.dw_up, s.dq, s.a, ot, T, r, nd);
  gemm_->linear_backward_input(s.da, DType::f32, s.dq, op_weight(m.w_up), ot, T, r, nd);
  kern::gr_silu_backward(s.dp, ot, s.da, m.p, T * r, n, stream_);
  // W_down: dW_down += dp^T Hn, dHn += dp W_down; the write gates' projection the same way.
  gemm_->linear_backward_weight(m.dw_down, s.dp, s.hn, ot, T, nd, r);
  gemm_->linear_backward_input(s.dhn, DType::f32, s.dp, op_weight(m.w_down), ot, T, nd, r, true);
  if (j < L) {
    gemm_->linear_backward_weight(m.dw_inject, s.ds, s.hn, ot, T, nd, n);
    gemm_->linear_backward_input(s.dhn, DType::f32, s.ds, op_weight(m.w_inject), ot, T, nd, n, true);
  }
  // The branch norm: dH += its input gradient, dw += its weight's.
  kern::gr_norm_backward(s.dH, m.dnorm, s.dhn, m.H, m.rms, m.norm, T, n, d, buf_.reduce, stream_);
  if (j == 0) kern::gr_reduce(buf_.demb, s.dH, T, n, d, stream_);  // the entry's copies: their gradients add up
}

}  // namespace attnres::cuda
