#include "cuda/cuda_model.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "kernels/rope.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

using kernels::MatmulPrecision;

namespace {

constexpr std::size_t kAlign = 256;  // every arena buffer (cuBLASLt's preferred alignment)
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Rows of one LM-head + cross-entropy chunk: about 512 MiB of fp32 logits, a multiple of 64.
std::int64_t ce_rows_for(std::int64_t bt, int vocab) {
  std::int64_t rows = (std::int64_t(1) << 29) / (4 * std::int64_t(vocab)) / 64 * 64;
  rows = std::max<std::int64_t>(rows, 64);
  return std::min(rows, bt);
}

}  // namespace

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Construction and memory
// ---------------------------------------------------------------------------------------------

CudaModel::CudaModel(const ModelConfig& config, std::int64_t max_batch, int max_seq, MatmulPrecision precision,
                     bool with_grad, int device)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_(max_seq),
      with_grad_(with_grad),
      device_(device),
      precision_(precision),
      topo_(config) {
  require(max_batch >= 1, "batch size must be at least 1");
  require(max_seq >= 1 && max_seq <= config.max_seq_len, "sequence length ", max_seq,
          " must be between 1 and model.max_seq_len = ", config.max_seq_len);
  require(config.d_model <= kern::kMaxWidth, "the CUDA backend supports d_model up to ", kern::kMaxWidth);
  require(max_batch * max_seq <= (std::int64_t(1) << 30), "batch x sequence too large for the CUDA backend");
  ATTNRES_CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t s = nullptr;
  ATTNRES_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  gemm_ = std::make_unique<Gemm>(stream_);
  ce_rows_ = ce_rows_for(max_batch_ * max_seq_, config_.vocab_size);

  const auto bytes = static_cast<std::size_t>(layout_.total()) * sizeof(float);
  params_ = DeviceBuffer(bytes);
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(params_.data(), 0, bytes, stream_));
  w_ = bind_weights<float>(config_, layout_, std::span<float>(params_.as<float>(), layout_.total()));
  if (with_grad_) {
    grads_ = DeviceBuffer(bytes);
    ATTNRES_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, bytes, stream_));
    g_ = bind_weights<float>(config_, layout_, std::span<float>(grads_.as<float>(), layout_.total()));
  }
  const std::int64_t bt = max_batch_ * max_seq_;
  host_tokens_ = PinnedBuffer(sizeof(std::int32_t) * static_cast<std::size_t>(5 * bt + 1));
  host_loss_ = PinnedBuffer(sizeof(double));
  counts_.assign(static_cast<std::size_t>(config_.vocab_size), 0);
  buf_.sub.resize(static_cast<std::size_t>(config_.n_sublayers()));
  if (precision_ == MatmulPrecision::bf16) shadow_ = DeviceBuffer(static_cast<std::size_t>(layout_.total()) * 2);
  build_arena();
}

CudaModel::~CudaModel() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
}

void CudaModel::synchronize() const { ATTNRES_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::size_t CudaModel::device_bytes() const {
  return params_.bytes() + grads_.bytes() + shadow_.bytes() + arena_.bytes() + gemm_->workspace_bytes();
}

void CudaModel::set_precision(MatmulPrecision p) {
  if (p == precision_) return;
  ATTNRES_CUDA_CHECK(cudaSetDevice(device_));
  synchronize();
  precision_ = p;
  if (p == MatmulPrecision::bf16) shadow_ = DeviceBuffer(static_cast<std::size_t>(layout_.total()) * 2);
  else shadow_.reset();
  shadow_valid_ = false;
  build_arena();
}

// Lays every buffer out in the arena; with base == nullptr it only counts.
void CudaModel::carve(unsigned char* base, std::size_t& used) {
  auto take = [&](std::int64_t bytes) -> void* {
    used = align_up(used);
    void* p = base != nullptr ? base + used : nullptr;
    used += static_cast<std::size_t>(bytes);
    return p;
  };
  auto f32 = [&](std::int64_t n) { return static_cast<float*>(take(n * 4)); };
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(op_type()));
  auto op = [&](std::int64_t n) { return take(n * es); };
  const std::int64_t bt = max_batch_ * max_seq_, d = config_.d_model, H = config_.mlp_hidden,
                     nh = config_.n_heads, V = config_.vocab_size;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  Buffers& b = buf_;
  b.emb = f32(bt * d);
  for (int j = 0; j < L; ++j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    s = Sublayer{};
    if (reads) {
      const ReadPlan& p = topo_.read(j);
      const auto n_src = static_cast<std::int64_t>(p.sources.size());
      s.h = f32(bt * d);
      s.rms = f32(bt * n_src);
      s.read_logits = f32(p.n_routes * bt * n_src);
    }
    s.x = op(bt * d);
    s.rstd = f32(bt);
    if (is_attention(j)) {
      s.q = op(bt * d);
      s.k = op(bt * d);
      s.v = op(bt * d);
      s.att = op(bt * d);
      s.lse = f32(bt * nh);
    } else {
      s.gate = op(bt * H);
      s.up = op(bt * H);
      s.act = op(bt * H);
    }
    s.out = f32(bt * d);
  }
  if (reads) {
    const auto n_src = static_cast<std::int64_t>(topo_.read(topo_.final_read()).sources.size());
    b.h_final = f32(bt * d);
    b.rms_final = f32(bt * n_src);
    b.logits_final = f32(bt * n_src);
  } else {
    b.h_final = b.rms_final = b.logits_final = nullptr;
  }
  b.x_final = op(bt * d);
  b.rstd_final = f32(bt);
  const bool separate = topo_.any_separate_value();
  b.hv = separate ? f32(bt * d) : nullptr;
  b.xv = separate ? op(bt * d) : nullptr;
  b.rstdv = separate ? f32(bt) : nullptr;
  const int half = config_.head_dim() / 2;
  b.rope_cos = f32(std::int64_t(config_.max_seq_len) * half);
  b.rope_sin = f32(std::int64_t(config_.max_seq_len) * half);
  b.ce_logits = f32(ce_rows_ * V);
  b.ce_dlogits = op_type() == DType::bf16 && with_grad_ ? op(ce_rows_ * V) : static_cast<void*>(b.ce_logits);
  b.row_loss = static_cast<double*>(take(8 * bt));
  b.loss = static_cast<double*>(take(8));
  b.tokens = static_cast<std::int32_t*>(take(4 * (5 * bt + 1)));
  const auto n_reads = static_cast<std::int64_t>(topo_.reads().size());
  const std::int64_t max_sources = topo_.max_sources();
  b.read_sources = static_cast<const float**>(take(8 * std::max<std::int64_t>(1, n_reads * max_sources)));
  b.read_dsources = static_cast<float**>(take(8 * std::max<std::int64_t>(1, n_reads * max_sources)));
  if (with_grad_) {
    // demb and every sublayer's dout in one block: one memset zeroes them.
    float* dall = f32(bt * d * (L + 1));
    b.demb = dall;
    for (int j = 0; j < L; ++j) b.sub[static_cast<std::size_t>(j)].dout = base != nullptr ? dall + (j + 1) * bt * d : nullptr;
    b.dx_final = f32(bt * d);
    b.dh = f32(bt * d);
    b.dx = f32(bt * d);
    b.dhv = separate ? f32(bt * d) : nullptr;
    b.dxv = separate ? f32(bt * d) : nullptr;
    b.dq = op(bt * d);
    b.dk = op(bt * d);
    b.dv = op(bt * d);
    b.datt = op(bt * d);
    b.dout_op = op_type() == DType::bf16 ? op(bt * d) : nullptr;
    b.dgate = op(bt * H);
    b.dup = op(bt * H);
    b.dact = op(bt * H);
    b.delta = f32(bt * nh);
    b.reduce = f32(std::max(kern::rmsnorm_scratch_floats(bt, config_.d_model),
                            kern::depth_read_scratch_floats(bt, config_.d_model)));
  }
  used = align_up(used);
}

void CudaModel::build_arena() {
  synchronize();
  arena_.reset();
  std::size_t size = 0;
  carve(nullptr, size);
  arena_ = DeviceBuffer(size);
  std::size_t used = 0;
  carve(arena_.as<unsigned char>(), used);
  require(used == size, "CudaModel: arena layout changed between passes");
  // RoPE tables: the CPU model's (computed in double, rounded to fp32).
  const int half = config_.head_dim() / 2;
  std::vector<float> cos(static_cast<std::size_t>(config_.max_seq_len) * half),
      sin(static_cast<std::size_t>(config_.max_seq_len) * half);
  kernels::rope_tables<float>(cos.data(), sin.data(), config_.max_seq_len, config_.head_dim(), config_.rope_theta);
  // (All copies go through the model's stream: it is non-blocking, so the legacy default stream
  // that plain cudaMemcpy uses would not be ordered with it.)
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.rope_cos, cos.data(), cos.size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream_));
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.rope_sin, sin.data(), sin.size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream_));
  // Source pointer tables of every read.
  if (topo_.has_reads()) {
    const std::vector<ReadPlan>& plans = topo_.reads();
    const auto max_sources = static_cast<std::size_t>(topo_.max_sources());
    std::vector<const float*> src(plans.size() * max_sources, nullptr);
    std::vector<float*> dsrc(src.size(), nullptr);
    for (std::size_t r = 0; r < plans.size(); ++r)
      for (std::size_t s = 0; s < plans[r].sources.size(); ++s) {
        src[r * max_sources + s] = residual(plans[r].sources[s]);
        dsrc[r * max_sources + s] = with_grad_ ? dresidual(plans[r].sources[s]) : nullptr;
      }
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.read_sources, src.data(), src.size() * sizeof(const float*),
                                       cudaMemcpyHostToDevice, stream_));
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.read_dsources, dsrc.data(), dsrc.size() * sizeof(float*),
                                       cudaMemcpyHostToDevice, stream_));
  }
  synchronize();
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

void CudaModel::init_params(std::uint64_t seed) {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()));
  attnres::init_params<float>(layout_, seed, host);
  load_params_from_host(host);
}

void CudaModel::load_params_from_host(std::span<const float> params) {
  require(static_cast<std::int64_t>(params.size()) == layout_.total(), "load_params_from_host: expected ",
          layout_.total(), " values, got ", params.size());
  ATTNRES_CUDA_CHECK(cudaSetDevice(device_));
  synchronize();
  ATTNRES_CUDA_CHECK(
      cudaMemcpyAsync(params_.data(), params.data(), params.size_bytes(), cudaMemcpyHostToDevice, stream_));
  synchronize();
  shadow_valid_ = false;
}

void CudaModel::copy_params_to_host(std::span<float> params) const {
  require(static_cast<std::int64_t>(params.size()) == layout_.total(), "copy_params_to_host: expected ",
          layout_.total(), " values, got ", params.size());
  ATTNRES_CUDA_CHECK(
      cudaMemcpyAsync(params.data(), params_.data(), params.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaModel::copy_grads_to_host(std::span<float> grads) const {
  require(with_grad_, "this model was built without gradient buffers");
  require(static_cast<std::int64_t>(grads.size()) == layout_.total(), "copy_grads_to_host: expected ",
          layout_.total(), " values, got ", grads.size());
  ATTNRES_CUDA_CHECK(
      cudaMemcpyAsync(grads.data(), grads_.data(), grads.size_bytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaModel::refresh_shadow() {
  if (precision_ != MatmulPrecision::bf16 || shadow_valid_) return;
  kern::cast_to_bf16(shadow_.data(), params_.as<float>(), layout_.total(), stream_);
  shadow_valid_ = true;
}

void CudaModel::update_params(const std::function<void(const ParamUpdate&)>& update) {
  ATTNRES_CUDA_CHECK(cudaSetDevice(device_));
  const bool bf16 = precision_ == MatmulPrecision::bf16;
  update({params_.as<float>(), grads_.as<float>(), bf16 ? shadow_.data() : nullptr, layout_.total(), stream_});
  shadow_valid_ = bf16;
}

const void* CudaModel::op_weight(const float* w) const {
  if (precision_ != MatmulPrecision::bf16) return w;
  const std::ptrdiff_t offset = w - params_.as<float>();
  return shadow_.as<unsigned char>() + offset * 2;
}

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

// Validates the tokens like the CPU model, splits inputs and targets, and builds for the
// deterministic embedding backward the list of distinct ids with their positions (ascending).
void CudaModel::set_inputs(std::span<const std::int32_t> tokens, std::int64_t batch, int seq, bool with_targets) {
  require(batch >= 1 && batch <= max_batch_, "batch size ", batch, " exceeds the model's capacity ", max_batch_);
  require(seq >= 1 && seq <= max_seq_, "sequence length ", seq, " exceeds the model's capacity ", max_seq_);
  const std::int64_t row = with_targets ? seq + 1 : seq;
  require(static_cast<std::int64_t>(tokens.size()) == batch * row, "expected ", batch * row, " tokens, got ",
          tokens.size());
  ATTNRES_CUDA_CHECK(cudaSetDevice(device_));
  synchronize();  // the previous upload from the pinned staging buffer is complete
  const std::int64_t bt = max_batch_ * max_seq_, n = batch * seq;
  std::int32_t* host = host_tokens_.as<std::int32_t>();
  std::int32_t* in = host;
  std::int32_t* tg = host + bt;
  std::int32_t* ids = host + 2 * bt;
  std::int32_t* starts = host + 3 * bt;
  std::int32_t* pos = host + 4 * bt + 1;
  const int V = config_.vocab_size;
  for (std::int64_t b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) {
      const std::int32_t x = tokens[static_cast<std::size_t>(b * row + t)];
      require(x >= 0 && x < V, "token id ", x, " is outside the vocabulary [0, ", V, ")");
      in[b * seq + t] = x;
      if (with_targets) {
        const std::int32_t y = tokens[static_cast<std::size_t>(b * row + t + 1)];
        require(y >= 0 && y < V, "token id ", y, " is outside the vocabulary [0, ", V, ")");
        tg[b * seq + t] = y;
      }
    }
  // Counting sort of positions by token id (stable: ascending positions within an id).
  for (std::int64_t t = 0; t < n; ++t) ++counts_[static_cast<std::size_t>(in[t])];
  int n_ids = 0;
  std::int32_t running = 0;
  for (int id = 0; id < V; ++id) {
    const std::int32_t c = counts_[static_cast<std::size_t>(id)];
    if (c == 0) continue;
    ids[n_ids] = id;
    starts[n_ids] = running;
    counts_[static_cast<std::size_t>(id)] = running;  // now the write cursor
    running += c;
    ++n_ids;
  }
  starts[n_ids] = running;
  for (std::int64_t t = 0; t < n; ++t) pos[counts_[static_cast<std::size_t>(in[t])]++] = static_cast<std::int32_t>(t);
  for (int u = 0; u < n_ids; ++u) counts_[static_cast<std::size_t>(ids[u])] = 0;
  n_ids_ = n_ids;
  n_tok_ = n;
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.tokens, host, sizeof(std::int32_t) * static_cast<std::size_t>(5 * bt + 1),
                                     cudaMemcpyHostToDevice, stream_));
}

// ---------------------------------------------------------------------------------------------
// Buffers by role (as in the CPU model)
// ---------------------------------------------------------------------------------------------

const float* CudaModel::residual(int index) const {
  if (index == kNoStream) return nullptr;
  return index == kEmbedding ? buf_.emb : buf_.sub[static_cast<std::size_t>(index)].out;
}

float* CudaModel::dresidual(int index) {
  if (index == kNoStream) return nullptr;
  return index == kEmbedding ? buf_.demb : buf_.sub[static_cast<std::size_t>(index)].dout;
}

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
  a.scratch = buf_.reduce;
  kern::depth_read_backward(a, stream_);
}

// ---------------------------------------------------------------------------------------------
// Forward and backward (model/model.cpp, step for step)
// ---------------------------------------------------------------------------------------------

void CudaModel::forward_trunk(std::int64_t batch, int seq) {
  refresh_shadow();
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
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
    } else {
      kern::rmsnorm_forward(s.x, ot, s.rstd, residual(topo_.input(j)), norm_w, n, d, eps, stream_);
    }
    const float* base = residual(topo_.write_base(j));
    if (attn) {
      gemm_->linear_forward(s.q, ot, s.x, op_weight(lw.wq), ot, n, d, d);
      gemm_->linear_forward(s.k, ot, s.x, op_weight(lw.wk), ot, n, d, d);
      gemm_->linear_forward(s.v, ot, separate ? buf_.xv : s.x, op_weight(lw.wv), ot, n, d, d);
      kern::rope(s.q, ot, n, seq, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin, false, stream_);
      kern::rope(s.k, ot, n, seq, config_.n_heads, config_.head_dim(), buf_.rope_cos, buf_.rope_sin, false, stream_);
      kern::attention_forward(s.att, s.lse, s.q, s.k, s.v, ot, shape, stream_);
      gemm_->linear_forward(s.out, DType::f32, s.att, op_weight(lw.wo), ot, n, d, d, base);
    } else {
      gemm_->linear_forward(s.gate, ot, s.x, op_weight(lw.w_gate), ot, n, d, H);
      gemm_->linear_forward(s.up, ot, s.x, op_weight(lw.w_up), ot, n, d, H);
      kern::swiglu_forward(s.act, s.gate, s.up, ot, n * H, stream_);
      gemm_->linear_forward(s.out, DType::f32, s.act, op_weight(lw.w_down), ot, n, H, d, base);
    }
  }
  if (reads) {
    read_forward(topo_.final_read(), read_params(w_, topo_, topo_.final_read()), w_.final_norm, buf_.h_final,
                 buf_.x_final, buf_.rstd_final, buf_.rms_final, buf_.logits_final, false);
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
    gemm_->linear_forward(buf_.ce_logits, DType::f32, x, W, ot, rows, d, V);
    void* dl = with_grad ? buf_.ce_dlogits : nullptr;
    const DType dl_type = dl == static_cast<void*>(buf_.ce_logits) ? DType::f32 : ot;
    kern::cross_entropy(buf_.ce_logits, targets + r0, rows, V, buf_.row_loss + r0, dl, dl_type, scale, stream_);
    if (with_grad) {
      gemm_->linear_backward_input(buf_.dx_final + r0 * d, DType::f32, dl, W, dl_type, rows, d, V);
      gemm_->linear_backward_weight(g_.lm_head, dl, x, dl_type, rows, d, V);
    }
  }
  kern::sum_doubles(buf_.row_loss, n, buf_.loss, stream_);
  ATTNRES_CUDA_CHECK(
      cudaMemcpyAsync(host_loss_.as<double>(), buf_.loss, sizeof(double), cudaMemcpyDeviceToHost, stream_));
}

void CudaModel::backward_trunk(std::int64_t batch, int seq) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, H = config_.mlp_hidden;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  const DType ot = op_type();
  const bool bf16 = ot == DType::bf16;
  const kern::AttentionShape shape{batch, seq, config_.n_heads, config_.head_dim()};
  Buffers& b = buf_;

  // Final norm and read (grads and activation gradients were zeroed by the caller).
  if (reads) {
    kern::rmsnorm_backward(b.dh, false, g_.final_norm, b.dx_final, b.h_final, w_.final_norm, b.rstd_final, n, d,
                           b.reduce, stream_);
    const int final_read = topo_.final_read();
    read_backward(final_read, read_params(w_, topo_, final_read), read_params(g_, topo_, final_read), b.dh, nullptr,
                  b.rms_final, b.logits_final);
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
    // s.dout is complete: every later user of this partial sum has been visited.
    float* dbase = dresidual(topo_.write_base(j));
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
      kern::attention_backward(b.dq, b.dk, b.dv, b.datt, s.q, s.k, s.v, s.att, s.lse, b.delta, ot, shape, stream_);
      kern::rope(b.dq, ot, n, seq, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin, true, stream_);
      kern::rope(b.dk, ot, n, seq, config_.n_heads, config_.head_dim(), b.rope_cos, b.rope_sin, true, stream_);
      gemm_->linear_backward_weight(lg.wq, b.dq, s.x, ot, n, d, d);
      gemm_->linear_backward_weight(lg.wk, b.dk, s.x, ot, n, d, d);
      gemm_->linear_backward_weight(lg.wv, b.dv, separate ? b.xv : s.x, ot, n, d, d);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dq, op_weight(lw.wq), ot, n, d, d);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dk, op_weight(lw.wk), ot, n, d, d, true);
      if (separate) gemm_->linear_backward_input(b.dxv, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d);
      else gemm_->linear_backward_input(b.dx, DType::f32, b.dv, op_weight(lw.wv), ot, n, d, d, true);
    } else {
      gemm_->linear_backward_weight(lg.w_down, dy, s.act, ot, n, H, d);
      gemm_->linear_backward_input(b.dact, ot, dy, op_weight(lw.w_down), ot, n, H, d);
      kern::swiglu_backward(b.dgate, b.dup, b.dact, s.gate, s.up, ot, n * H, stream_);
      gemm_->linear_backward_weight(lg.w_gate, b.dgate, s.x, ot, n, d, H);
      gemm_->linear_backward_weight(lg.w_up, b.dup, s.x, ot, n, d, H);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dgate, op_weight(lw.w_gate), ot, n, d, H);
      gemm_->linear_backward_input(b.dx, DType::f32, b.dup, op_weight(lw.w_up), ot, n, d, H, true);
    }
    if (reads) {
      kern::rmsnorm_backward(b.dh, false, dnorm_w, b.dx, s.h, norm_w, s.rstd, n, d, b.reduce, stream_);
      if (separate)
        kern::rmsnorm_backward(b.dhv, false, dnorm_w, b.dxv, b.hv, norm_w, b.rstdv, n, d, b.reduce, stream_);
      read_backward(j, read_params(w_, topo_, j), read_params(g_, topo_, j), b.dh, b.dhv, s.rms, s.read_logits);
    } else {
      kern::rmsnorm_backward(dresidual(topo_.input(j)), true, dnorm_w, b.dx, residual(topo_.input(j)), norm_w,
                             s.rstd, n, d, b.reduce, stream_);
    }
  }
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
  const std::int64_t bt = max_batch_ * max_seq_;
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), stream_));
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(
      buf_.demb, 0, sizeof(float) * static_cast<std::size_t>(bt * config_.d_model * (config_.n_sublayers() + 1)),
      stream_));
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

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

CudaAdamW::CudaAdamW(const ParamLayout& layout, AdamWConfig config, int device) : config_(config), n_(layout.total()) {
  ATTNRES_CUDA_CHECK(cudaSetDevice(device));
  const auto bytes = static_cast<std::size_t>(n_) * sizeof(float);
  m_ = DeviceBuffer(bytes);
  v_ = DeviceBuffer(bytes);
  ATTNRES_CUDA_CHECK(cudaMemset(m_.data(), 0, bytes));
  ATTNRES_CUDA_CHECK(cudaMemset(v_.data(), 0, bytes));
  // Weight decay on matrices only (ParamInfo::weight_decay), as contiguous ranges.
  std::vector<std::int64_t> begin, end;
  if (config_.weight_decay != 0) {
    for (const ParamInfo& p : layout.params()) {
      if (!p.weight_decay()) continue;
      if (!end.empty() && end.back() == p.offset) end.back() += p.numel;
      else {
        begin.push_back(p.offset);
        end.push_back(p.offset + p.numel);
      }
    }
  }
  n_ranges_ = static_cast<int>(begin.size());
  ranges_ = DeviceBuffer(sizeof(std::int64_t) * std::max<std::size_t>(1, 2 * begin.size()));
  if (n_ranges_ > 0) {
    ATTNRES_CUDA_CHECK(cudaMemcpy(ranges_.data(), begin.data(), sizeof(std::int64_t) * begin.size(),
                                  cudaMemcpyHostToDevice));
    ATTNRES_CUDA_CHECK(cudaMemcpy(ranges_.as<std::int64_t>() + n_ranges_, end.data(),
                                  sizeof(std::int64_t) * end.size(), cudaMemcpyHostToDevice));
  }
  partials_ = DeviceBuffer(sizeof(double) * static_cast<std::size_t>(std::max<std::int64_t>(
                                                1, (n_ + kern::kNormChunk - 1) / kern::kNormChunk)));
  norm_ = DeviceBuffer(sizeof(double));
  clip_ = DeviceBuffer(2 * sizeof(float));
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy-stream memsets and copies above are done
}

double CudaAdamW::step(CudaModel& model, double lr, double max_norm) {
  require(model.n_params() == n_, "CudaAdamW: the model has ", model.n_params(), " parameters, the optimizer ", n_);
  ATTNRES_CUDA_CHECK(cudaSetDevice(model.device()));
  ++t_;
  // The CPU optimizer's scalars, computed the same way (double, then rounded to float).
  const double b1 = config_.beta1, b2 = config_.beta2;
  kern::AdamWStep st;
  st.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, static_cast<double>(t_))));
  st.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_))));
  st.decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  st.beta1 = static_cast<float>(b1);
  st.beta2 = static_cast<float>(b2);
  st.one_minus_beta1 = static_cast<float>(1.0 - b1);
  st.one_minus_beta2 = static_cast<float>(1.0 - b2);
  st.eps = static_cast<float>(config_.eps);
  const Stream s = model.stream();
  // The clip-and-update pass also writes the model's bf16 weight copy (in bf16 mode).
  model.update_params([&](const CudaModel::ParamUpdate& u) {
    kern::grad_norm(u.grads, n_, partials_.as<double>(), max_norm, norm_.as<double>(), clip_.as<float>(), u.stream);
    kern::adamw(u.params, u.grads, m_.as<float>(), v_.as<float>(), n_, st, clip_.as<float>(),
                ranges_.as<std::int64_t>(), ranges_.as<std::int64_t>() + n_ranges_, n_ranges_, u.params_bf16,
                u.stream);
  });
  double norm = 0;
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(&norm, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, s));
  ATTNRES_CUDA_CHECK(cudaStreamSynchronize(s));
  return norm;
}

void CudaAdamW::copy_state_to_host(std::span<float> m, std::span<float> v) const {
  require(static_cast<std::int64_t>(m.size()) == n_ && static_cast<std::int64_t>(v.size()) == n_,
          "CudaAdamW: state buffer size mismatch");
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNRES_CUDA_CHECK(cudaMemcpy(m.data(), m_.data(), m.size_bytes(), cudaMemcpyDeviceToHost));
  ATTNRES_CUDA_CHECK(cudaMemcpy(v.data(), v_.data(), v.size_bytes(), cudaMemcpyDeviceToHost));
}

void CudaAdamW::load_state_from_host(std::span<const float> m, std::span<const float> v) {
  require(static_cast<std::int64_t>(m.size()) == n_ && static_cast<std::int64_t>(v.size()) == n_,
          "CudaAdamW: state buffer size mismatch");
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNRES_CUDA_CHECK(cudaMemcpy(m_.data(), m.data(), m.size_bytes(), cudaMemcpyHostToDevice));
  ATTNRES_CUDA_CHECK(cudaMemcpy(v_.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice));
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable upload may return before its DMA lands
}

std::size_t CudaAdamW::device_bytes() const {
  return m_.bytes() + v_.bytes() + ranges_.bytes() + partials_.bytes() + norm_.bytes() + clip_.bytes();
}

}  // namespace attnres::cuda
