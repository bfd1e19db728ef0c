// CudaModel's construction, device memory (the arena), parameters and inputs; its passes are in
// cuda_model_passes.cpp, CudaAdamW in cuda_adamw.cpp.
#include "cuda/cuda_model.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

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
  attention_ = std::make_unique<Attention>(stream_);
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
  std::size_t table = 0;
  for (const DwaPlan& plan : topo_.dwas()) {
    const std::int64_t offset = layout_.at("dwa." + std::to_string(plan.block) + ".alpha").offset;
    dwa_alpha_.push_back(params_.as<float>() + offset);
    dwa_dalpha_.push_back(with_grad_ ? grads_.as<float>() + offset : nullptr);
    dwa_table_.push_back(table);
    table += plan.sources.size();
  }
  delta_bind();  // Delta AttnRes's reads (cuda_model_delta.cpp)
  gr_bind();  // the Gated Residual's modules (none in other modes)
  streams_ = config_.uses_streams();
  if (streams_) bind_streams();  // hc / mhc (cuda_model_streams.cpp)
  // Issue #49: the batched read backward's groups.
  read_groups_ = topo_.read_groups(kern::kMaxReadGroup);
  read_group_of_.assign(topo_.reads().size(), -1);
  for (std::size_t i = 0; i < read_groups_.size(); ++i) {
    for (int r = read_groups_[i].lo; r <= read_groups_[i].hi; ++r)
      read_group_of_[static_cast<std::size_t>(r)] = static_cast<int>(i);
    read_group_slots_ = std::max(read_group_slots_, read_groups_[i].hi - read_groups_[i].lo + 1);
    int value_slots = 0;
    for (int r = read_groups_[i].lo; r <= read_groups_[i].hi; ++r) value_slots += topo_.read(r).separate_value ? 1 : 0;
    read_group_value_slots_ = std::max(read_group_value_slots_, value_slots);
  }
  if (config_.uses_mudd()) mudd_init();  // cuda_model_mudd.cpp
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
    attention_.reset();
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
}

void CudaModel::synchronize() const { ATTNRES_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::size_t CudaModel::device_bytes() const {
  return params_.bytes() + grads_.bytes() + shadow_.bytes() + arena_.bytes() + gemm_->workspace_bytes() +
         attention_->workspace_bytes();
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
    } else if (delta_ && !delta_src_[static_cast<std::size_t>(j)].empty()) {
      const auto n_src = static_cast<std::int64_t>(delta_src_[static_cast<std::size_t>(j)].size());
      s.h = f32(bt * d);
      s.rms = f32(bt * n_src);
      s.read_logits = f32((delta_opt_[static_cast<std::size_t>(j)].value_route ? 2 : 1) * bt * n_src);
    } else if (streams_) {
      s.h = f32(bt * d);  // the stream module's read
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
  {  // hc / mhc: the states H_0 .. H_L, the modules' saved values (none for static HC), the readout
    // (h_final) and the modules' scratch; the state gradients come with the other gradients.
    const std::int64_t ns = config_.n_streams(), m = ns * (ns + 2);
    const bool saved = config_.uses_dynamic_streams();
    b.stream_state.assign(streams_ ? static_cast<std::size_t>(L + 1) : 0, nullptr);
    for (float*& x : b.stream_state) x = f32(bt * ns * d);
    b.stream_coef.assign(saved ? static_cast<std::size_t>(L) : 0, nullptr);
    b.stream_act.assign(b.stream_coef.size(), nullptr);
    b.stream_rms.assign(b.stream_coef.size(), nullptr);
    for (std::size_t j = 0; j < b.stream_coef.size(); ++j) {
      b.stream_coef[j] = f32(bt * m);
      b.stream_act[j] = f32(bt * m);
      b.stream_rms[j] = f32(bt * ns);
    }
    if (streams_) b.h_final = f32(bt * d);
    b.stream_scratch = streams_ ? f32(stream_scratch_floats(config_, bt)) : nullptr;
    b.dstate[0] = streams_ && with_grad_ ? f32(bt * ns * d) : nullptr;
    b.dstate[1] = streams_ && with_grad_ ? f32(bt * ns * d) : nullptr;
    b.dbeta = streams_ && with_grad_ ? f32(bt * ns) : nullptr;
  }
  b.delta_x.assign(delta_ ? static_cast<std::size_t>(L) : 0, nullptr);
  for (float*& x : b.delta_x) x = f32(bt * d);
  b.delta_f = delta_ ? f32(bt * d) : nullptr;
  const auto delta_entries = static_cast<std::int64_t>(delta_ ? L * delta_max_src_ : 1);
  b.delta_sources = static_cast<const float**>(take(8 * delta_entries));
  b.delta_dsources = static_cast<float**>(take(8 * delta_entries));
  if (gr_) gr_carve(take);
  b.dwa_out.assign(static_cast<std::size_t>(config_.n_layers + 1), nullptr);
  b.ddwa_out.assign(b.dwa_out.size(), nullptr);
  std::int64_t dwa_max_sources = 0;
  for (const DwaPlan& plan : topo_.dwas()) {
    b.dwa_out[static_cast<std::size_t>(plan.block)] = f32(bt * d);
    dwa_max_sources = std::max(dwa_max_sources, static_cast<std::int64_t>(plan.sources.size()));
  }
  const bool vres = config_.value_residual && config_.n_layers > 1;
  b.vmix = vres ? op(bt * d) : nullptr;
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
  b.row_loss = static_cast<double*>(take(8 * bt));
  b.loss = static_cast<double*>(take(8));
  b.tokens = static_cast<std::int32_t*>(take(4 * (5 * bt + 1)));
  const auto n_reads = static_cast<std::int64_t>(topo_.reads().size());
  const std::int64_t max_sources = topo_.max_sources();
  b.read_sources = static_cast<const float**>(take(8 * std::max<std::int64_t>(1, n_reads * max_sources)));
  b.read_dsources = static_cast<float**>(take(8 * std::max<std::int64_t>(1, n_reads * max_sources)));
  const auto dwa_entries =
      static_cast<std::int64_t>(dwa_table_.empty() ? 1 : dwa_table_.back() + topo_.dwas().back().sources.size());
  b.dwa_sources = static_cast<const float**>(take(8 * dwa_entries));
  b.dwa_dsources = static_cast<float**>(take(8 * dwa_entries));
  if (with_grad_) {
    // demb, every sublayer's dout and every DWA's output gradient in one block: one memset zeroes them.
    const auto n_dwas = static_cast<std::int64_t>(topo_.dwas().size());
    const std::int64_t streams = L + 1 + n_dwas + (vres ? 1 : 0);
    b.dstream_floats = static_cast<std::size_t>(bt * d * streams);
    float* dall = f32(bt * d * streams);
    b.demb = dall;
    for (int j = 0; j < L; ++j) b.sub[static_cast<std::size_t>(j)].dout = base != nullptr ? dall + (j + 1) * bt * d : nullptr;
    for (std::int64_t i = 0; i < n_dwas; ++i)
      b.ddwa_out[static_cast<std::size_t>(topo_.dwas()[static_cast<std::size_t>(i)].block)] =
          base != nullptr ? dall + (L + 1 + i) * bt * d : nullptr;
    b.dv1 = vres && base != nullptr ? dall + (streams - 1) * bt * d : nullptr;
    b.dstream = delta_ ? f32(bt * d) : nullptr;
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
    // Issue #49: the read groups' slots (slot 0's output gradients are dh and dhv).
    const std::int64_t slots = read_group_slots_;
    b.read_dh = slots > 1 ? f32((slots - 1) * bt * d) : nullptr;
    const std::int64_t value_slots = read_group_value_slots_;
    b.read_dhv = separate && value_slots > 1 ? f32((value_slots - 1) * bt * d) : nullptr;
    b.read_coef = slots > 0 ? f32(slots * bt * topo_.max_sources() * kern::kDepthReadCoefs) : nullptr;
    b.read_scratch = slots > 0 ? f32(slots * kern::depth_read_scratch_floats(bt, d)) : nullptr;
    b.reduce = f32(std::max({kern::rmsnorm_scratch_floats(bt, config_.d_model),
                             kern::depth_read_scratch_floats(bt, config_.d_model),
                             kern::dwa_scratch_floats(bt, static_cast<int>(dwa_max_sources)),
                             kern::value_residual_scratch_floats(bt),
                             gr_ ? kern::gr_scratch_floats(bt, config_.gr_n, config_.d_model) : 0,
                             delta_ ? kern::delta_scratch_floats(bt, config_.d_model) : 0}));
  }
  if (mudd_) mudd_carve(f32, op);  // MUDDFormer's own buffers (cuda_model_mudd.cpp)
  if (delta_) delta_carve(f32, op);  // Delta AttnRes's options' buffers (cuda_model_delta.cpp)
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
  // ... of every Delta AttnRes read ...
  if (delta_) {
    std::vector<const float*> src(delta_src_.size() * delta_max_src_, nullptr);
    std::vector<float*> dsrc(src.size(), nullptr);
    for (std::size_t j = 0; j < delta_src_.size(); ++j)
      for (std::size_t k = 0; k < delta_src_[j].size(); ++k) {
        src[j * delta_max_src_ + k] = delta_source(delta_src_[j][k]);
        dsrc[j * delta_max_src_ + k] = with_grad_ ? delta_dsource(delta_src_[j][k]) : nullptr;
      }
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.delta_sources, src.data(), src.size() * sizeof(const float*),
                                       cudaMemcpyHostToDevice, stream_));
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.delta_dsources, dsrc.data(), dsrc.size() * sizeof(float*),
                                       cudaMemcpyHostToDevice, stream_));
  }
  // ... and of every DWA.
  if (!topo_.dwas().empty()) {
    std::vector<const float*> src;
    std::vector<float*> dsrc;
    for (const DwaPlan& plan : topo_.dwas())
      for (const int source : plan.sources) {
        src.push_back(residual(source));
        dsrc.push_back(with_grad_ ? dresidual(source) : nullptr);
      }
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.dwa_sources, src.data(), src.size() * sizeof(const float*),
                                       cudaMemcpyHostToDevice, stream_));
    ATTNRES_CUDA_CHECK(cudaMemcpyAsync(buf_.dwa_dsources, dsrc.data(), dsrc.size() * sizeof(float*),
                                       cudaMemcpyHostToDevice, stream_));
  }
  synchronize();
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

void CudaModel::init_params(std::uint64_t seed, double perturbation) {
  std::vector<float> host(static_cast<std::size_t>(layout_.total()));
  attnres::init_params<float>(layout_, seed, host, perturbation);
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
  if (topo_.is_dwa_stream(index)) return buf_.dwa_out[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
  return index == kEmbedding ? buf_.emb : buf_.sub[static_cast<std::size_t>(index)].out;
}

const float* CudaModel::delta_stream(int j) const {
  return j == 0 ? buf_.emb : buf_.delta_x[static_cast<std::size_t>(j - 1)];
}

float* CudaModel::dresidual(int index) {
  if (index == kNoStream) return nullptr;
  if (topo_.is_dwa_stream(index)) return buf_.ddwa_out[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
  return index == kEmbedding ? buf_.demb : buf_.sub[static_cast<std::size_t>(index)].dout;
}

}  // namespace attnres::cuda
