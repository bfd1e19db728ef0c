// CudaModel's hyper-connections (hc, static and dynamic; baselines-spec §3) and mHC (mhc, §4):
// model/stream_trunk.cpp step for step on the n-stream state [n_tok, n, d]. The modules'
// projections are cuBLASLt GEMMs in fp32 whatever the precision (HC's n+2 rows per stream row,
// mHC's phi over the flattened state); the per-token parts are streams.cu's kernels. Only the
// sublayer bodies follow the matmul precision, as on the CPU.
#include <string>

#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

namespace {

// The modules' scratch (Buffers::stream_scratch), each slice 256-byte aligned. HC: proj [bt n,
// n+2] (forward: the projections' dots; backward: their gradients gproj), wg [n+2, d] (the
// projection rows times the norm weight), acc [n+2, d], partial [chunks, n(n+2)+2]. mHC: gz [bt,
// n(n+2)], partial [chunks, n(n+2)+3], work (kern::mhc_work_floats).
struct StreamScratch {
  float *proj = nullptr, *wg = nullptr, *acc = nullptr, *gz = nullptr, *partial = nullptr, *work = nullptr;
};

std::int64_t aligned(std::int64_t floats) { return (floats + 63) / 64 * 64; }

// The layout from base (null: only the size); returns the floats it takes.
std::int64_t stream_scratch_layout(const ModelConfig& c, std::int64_t bt, float* base, StreamScratch* out) {
  const std::int64_t n = c.n_streams(), m = n * (n + 2), d = c.d_model, chunks = kern::num_chunks(bt);
  std::int64_t used = 0;
  auto take = [&](std::int64_t floats) {
    float* p = base != nullptr ? base + used : nullptr;
    used += aligned(floats);
    return p;
  };
  StreamScratch s;
  if (c.residual == ResidualMode::hc) {
    s.proj = take(bt * n * (n + 2));
    s.wg = take((n + 2) * d);
    s.acc = take((n + 2) * d);
    s.partial = take(chunks * (m + 2));
  } else {
    s.gz = take(bt * m);
    s.partial = take(chunks * (m + 3));
    s.work = take(kern::mhc_work_floats(bt, static_cast<int>(n), c.mhc_sinkhorn_iters));
  }
  if (out != nullptr) *out = s;
  return used;
}

float readout_scale(const ModelConfig& c) {
  return c.stream_readout() == StreamReadout::mean ? 1.0f / static_cast<float>(c.n_streams()) : 1.0f;
}

}  // namespace

std::int64_t CudaModel::stream_scratch_floats(const ModelConfig& c, std::int64_t bt) {
  return stream_scratch_layout(c, bt, nullptr, nullptr);
}

void CudaModel::bind_streams() {
  auto offset = [&](const std::string& name) {
    const ParamInfo* p = layout_.find(name);
    return p != nullptr ? p->offset : std::int64_t(-1);
  };
  for (int j = 0; j < config_.n_sublayers(); ++j) {
    const std::string hc = "hc." + std::to_string(j) + ".", mhc = "mhc." + std::to_string(j) + ".";
    stream_modules_.push_back({offset(hc + "A"), offset(hc + "B"), offset(hc + "w_alpha"), offset(hc + "w_beta"),
                               offset(hc + "s_alpha"), offset(hc + "s_beta"), offset(hc + "norm.weight"),
                               offset(mhc + "phi"), offset(mhc + "alpha"), offset(mhc + "b")});
  }
}

const float* CudaModel::stream_param(std::int64_t offset) const {
  return offset < 0 ? nullptr : params_.as<float>() + offset;
}

float* CudaModel::stream_grad(std::int64_t offset) {
  return offset < 0 || !with_grad_ ? nullptr : grads_.as<float>() + offset;
}

kern::HyperConnection CudaModel::hc_module(int j) const {
  const StreamModule& w = stream_modules_[static_cast<std::size_t>(j)];
  kern::HyperConnection hc;
  hc.streams = buf_.stream_state[static_cast<std::size_t>(j)];
  hc.n_tok = n_tok_;
  hc.n = config_.hc_n;
  hc.d = config_.d_model;
  hc.eps = static_cast<float>(config_.norm_eps);
  hc.A = stream_param(w.A);
  hc.B = stream_param(w.B);
  if (config_.hc_dynamic) {
    hc.w_alpha = stream_param(w.w_alpha);
    hc.w_beta = stream_param(w.w_beta);
    hc.s_alpha = stream_param(w.s_alpha);
    hc.s_beta = stream_param(w.s_beta);
    hc.norm = stream_param(w.norm);
    hc.tanh = config_.hc_tanh;
  }
  return hc;
}

kern::Mhc CudaModel::mhc_module(int j) const {
  const StreamModule& w = stream_modules_[static_cast<std::size_t>(j)];
  kern::Mhc m;
  m.streams = buf_.stream_state[static_cast<std::size_t>(j)];
  m.n_tok = n_tok_;
  m.n = config_.mhc_n;
  m.d = config_.d_model;
  m.eps = static_cast<float>(config_.norm_eps);
  m.alpha = stream_param(w.alpha);
  m.bias = stream_param(w.bias);
  m.iters = config_.mhc_sinkhorn_iters;
  m.col_row = config_.mhc_sinkhorn_order == kernels::SinkhornOrder::col_row;
  m.pre_eps = static_cast<float>(config_.mhc_pre_eps);
  return m;
}

// The write's coefficients: the per-token ones the module saved, or static HC's A and B.
kern::StreamCoef CudaModel::stream_coefficients(int j) const {
  const int n = config_.n_streams();
  if (buf_.stream_coef.empty()) {
    const StreamModule& w = stream_modules_[static_cast<std::size_t>(j)];
    return {stream_param(w.A), stream_param(w.B), 0};
  }
  const float* coef = buf_.stream_coef[static_cast<std::size_t>(j)];
  return {coef, coef + n * (n + 1), n * (n + 2)};
}

// Module j's read h_j into sub[j].h (j = 0: after the entry H_0 = the embedding n times), then the
// sublayer's pre-norm.
void CudaModel::stream_read_forward(int j, const float* norm_w) {
  const int n = config_.n_streams(), d = config_.d_model, m = n * (n + 2);
  const auto jj = static_cast<std::size_t>(j);
  Sublayer& s = buf_.sub[jj];
  StreamScratch sc;
  stream_scratch_layout(config_, max_batch_ * max_seq_, buf_.stream_scratch, &sc);
  if (j == 0) kern::stream_expand(buf_.stream_state[0], buf_.emb, n_tok_, n, d, 1.0f, stream_);
  const bool saved = !buf_.stream_coef.empty();
  float* coef = saved ? buf_.stream_coef[jj] : nullptr;
  float* act = saved ? buf_.stream_act[jj] : nullptr;
  float* rms = saved ? buf_.stream_rms[jj] : nullptr;
  if (config_.residual == ResidualMode::hc) {
    const kern::HyperConnection hc = hc_module(j);
    if (config_.hc_dynamic) {
      kern::hc_scale_projections(sc.wg, hc, stream_);
      gemm_->linear_forward(sc.proj, DType::f32, hc.streams, sc.wg, DType::f32, n_tok_ * n, d, n + 2);
    }
    kern::hc_forward(hc, sc.proj, s.h, coef, act, rms, stream_);
  } else {
    const kern::Mhc mh = mhc_module(j);
    gemm_->linear_forward(act, DType::f32, mh.streams, stream_param(stream_modules_[jj].phi), DType::f32, n_tok_,
                          std::int64_t(n) * d, m);
    kern::mhc_forward(mh, act, s.h, coef, rms, stream_);
  }
  kern::rmsnorm_forward(s.x, op_type(), s.rstd, s.h, norm_w, n_tok_, d, static_cast<float>(config_.norm_eps), stream_);
}

void CudaModel::stream_write_forward(int j) {
  const auto jj = static_cast<std::size_t>(j);
  kern::stream_write_forward(buf_.stream_state[jj + 1], buf_.stream_state[jj], stream_coefficients(j),
                             buf_.sub[jj].out, n_tok_, config_.n_streams(), config_.d_model, stream_);
}

// The readout of H_L (the sum or mean of the streams) into h_final, then the final norm.
void CudaModel::stream_exit_forward() {
  const int L = config_.n_sublayers(), d = config_.d_model;
  kern::stream_reduce(buf_.h_final, buf_.stream_state[static_cast<std::size_t>(L)], n_tok_, config_.n_streams(), d,
                      readout_scale(config_), stream_);
  kern::rmsnorm_forward(buf_.x_final, op_type(), buf_.rstd_final, buf_.h_final, w_.final_norm, n_tok_, d,
                        static_cast<float>(config_.norm_eps), stream_);
}

// dL/dH_j lives in dstate[(L - j) % 2]: the exit writes dstate[0], module j reads dL/dH_{j+1} and
// writes dL/dH_j into the other one.
void CudaModel::stream_exit_backward() {
  Buffers& b = buf_;
  const int d = config_.d_model;
  kern::rmsnorm_backward(b.dh, false, g_.final_norm, b.dx_final, b.h_final, w_.final_norm, b.rstd_final, n_tok_, d,
                         b.reduce, stream_);
  kern::stream_expand(b.dstate[0], b.dh, n_tok_, config_.n_streams(), d, readout_scale(config_), stream_);
}

void CudaModel::stream_write_backward(int j) {
  const int L = config_.n_sublayers();
  const auto jj = static_cast<std::size_t>(j);
  kern::stream_write_backward(buf_.sub[jj].dout, buf_.dbeta, buf_.dstate[(L - j - 1) % 2], buf_.sub[jj].out,
                              stream_coefficients(j), n_tok_, config_.n_streams(), config_.d_model, stream_);
}

// Given dh = dL/dh_j: dL/dH_j and module j's parameter gradients (j = 0: then the entry's, into demb).
void CudaModel::stream_read_backward(int j, const float* dh) {
  const int L = config_.n_sublayers(), n = config_.n_streams(), d = config_.d_model, m = n * (n + 2);
  const auto jj = static_cast<std::size_t>(j);
  const StreamModule& w = stream_modules_[jj];
  float* dnext = buf_.dstate[(L - j - 1) % 2];
  float* dcur = buf_.dstate[(L - j) % 2];
  StreamScratch sc;
  stream_scratch_layout(config_, max_batch_ * max_seq_, buf_.stream_scratch, &sc);
  const bool saved = !buf_.stream_coef.empty();
  const float* coef = saved ? buf_.stream_coef[jj] : nullptr;
  const float* act = saved ? buf_.stream_act[jj] : nullptr;
  const float* rms = saved ? buf_.stream_rms[jj] : nullptr;
  if (config_.residual == ResidualMode::hc) {
    const kern::HyperConnection hc = hc_module(j);
    const kern::HyperConnectionGrads gr{stream_grad(w.A),       stream_grad(w.B),      stream_grad(w.w_alpha),
                                        stream_grad(w.w_beta),  stream_grad(w.s_alpha), stream_grad(w.s_beta),
                                        stream_grad(w.norm)};
    kern::hc_backward_width(hc, coef, act, rms, dh, dnext, buf_.dbeta, dcur, sc.proj, gr, sc.partial, stream_);
    if (config_.hc_dynamic) {
      // rows = gproj wg, into dnext (dL/dH_{j+1} is spent), then the row norms' backward; acc = gproj^T H.
      kern::hc_scale_projections(sc.wg, hc, stream_);
      gemm_->linear_backward_input(dnext, DType::f32, sc.proj, sc.wg, DType::f32, n_tok_ * n, d, n + 2);
      kern::hc_backward_norm(hc, rms, dnext, dcur, stream_);
      gemm_->run(true, false, n + 2, d, n_tok_ * n, 1.0f, sc.proj, n + 2, hc.streams, d, DType::f32, 0.0f, nullptr,
                 sc.acc, d, DType::f32);
      kern::hc_backward_params(hc, sc.acc, gr, stream_);
    }
  } else {
    const kern::Mhc mh = mhc_module(j);
    const float* phi = stream_param(w.phi);
    kern::mhc_backward_coef(mh, act, dh, dnext, buf_.dbeta, sc.gz, stream_grad(w.bias), stream_grad(w.alpha),
                            sc.partial, sc.work, stream_);
    gemm_->linear_backward_input(dcur, DType::f32, sc.gz, phi, DType::f32, n_tok_, std::int64_t(n) * d, m);
    kern::mhc_backward_state(mh, coef, rms, dh, dnext, dcur, sc.gz, stream_);
    gemm_->linear_backward_weight(stream_grad(w.phi), sc.gz, mh.streams, DType::f32, n_tok_, std::int64_t(n) * d, m);
  }
  if (j == 0) kern::stream_reduce(buf_.demb, dcur, n_tok_, n, d, 1.0f, stream_);
}

}  // namespace attnres::cuda
