// CudaModel's Delta AttnRes reads (delta, delta_block; docs/delta-gated-spec.md §1.2-§1.4):
// model/delta_trunk.cpp and kernels/delta_read step for step. Sublayer j's read is the depth read
// of depth_read.cu over its sources (the learned null source first when there is one, broadcast
// into one shared buffer before each read's forward and backward), its gated mix added to the
// stream inside the fused forward, h = x_j + g ⊙ c, then the pre-norm. With the V route an
// attention sublayer's read has a second route with its own query and key-norm weight over the
// same sources, through the same gate: h_V = x_j + g ⊙ c_V, and V's input is RMSNorm(h_V) with the
// sublayer's pre-norm weight. The vector gate g = sigmoid(W x_j + b) is a cuBLASLt GEMM in fp32 (the
// stream is fp32; the gate belongs to the read, which stays fp32 in both precisions), as are its
// backward's dW += dp^T x_j and dx_j += dp W. The rest of the trunk is cuda_model_passes.cpp's.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

namespace {
using kernels::DeltaGate;
}  // namespace

void CudaModel::delta_bind() {
  delta_ = config_.uses_delta_reads();
  delta_src_.clear();
  delta_opt_.clear();
  delta_max_src_ = 1;
  if (!delta_) return;
  const int L = config_.n_sublayers();
  for (int j = 0; j < L; ++j) {
    std::vector<int> src = delta_read_sources(config_, j);
    if (config_.delta_null_source) src.insert(src.begin(), kDeltaNullSource);
    delta_max_src_ = std::max(delta_max_src_, src.size());
    const std::string p = delta_read_prefix(j);
    auto view = [&](const std::string& name, const DeviceBuffer& flat) -> float* {
      const ParamInfo* info = layout_.find(p + name);
      return info == nullptr || flat.data() == nullptr ? nullptr : flat.as<float>() + info->offset;
    };
    const char* gate = delta_gate_tensor(config_.delta_gate);
    DeltaOptions o;
    o.value_route = is_attention(j) && config_.delta_value_route == DeltaValueRoute::decoupled && !src.empty();
    o.value_query = view("value_query", params_);
    o.value_key_norm = view("value_key_norm.weight", params_);
    o.null_source = view("null_source", params_);
    o.gate = gate != nullptr ? view(gate, params_) : nullptr;
    o.gate_bias = view("gate.bias", params_);
    o.dvalue_query = view("value_query", grads_);
    o.dvalue_key_norm = view("value_key_norm.weight", grads_);
    o.dnull_source = view("null_source", grads_);
    o.dgate = gate != nullptr ? view(gate, grads_) : nullptr;
    o.dgate_bias = view("gate.bias", grads_);
    require((!o.value_route || (o.value_query != nullptr && o.value_key_norm != nullptr)) &&
                (!config_.delta_null_source || o.null_source != nullptr) &&
                (config_.delta_gate == DeltaGate::none || o.gate != nullptr) &&
                (config_.delta_gate != DeltaGate::sigmoid_vector || o.gate_bias != nullptr),
            "CudaModel: Delta AttnRes's read '", p, "' is missing tensors from the layout");
    delta_src_.push_back(std::move(src));
    delta_opt_.push_back(o);
  }
}

// Only what the options need: per read with sources the mixes (with a gate), the vector gate's
// values, the V route's h_V, x_V, RMS factors; the shared null source and gradient buffers.
void CudaModel::delta_carve(const std::function<float*(std::int64_t)>& f32,
                            const std::function<void*(std::int64_t)>& op) {
  const std::int64_t bt = max_batch_ * max_seq_, d = config_.d_model;
  const bool gated = config_.delta_gate != DeltaGate::none;
  const bool vector = config_.delta_gate == DeltaGate::sigmoid_vector;
  bool any_value_route = false;
  for (std::size_t j = 0; j < delta_opt_.size(); ++j) {
    DeltaOptions& o = delta_opt_[j];
    o.c = o.cv = o.g = o.hv = o.rstdv = nullptr;
    o.xv = nullptr;
    if (delta_src_[j].empty()) continue;
    if (gated) o.c = f32(bt * d);
    if (vector) o.g = f32(bt * d);
    if (o.value_route) {
      any_value_route = true;
      if (gated) o.cv = f32(bt * d);
      o.hv = f32(bt * d);
      o.xv = op(bt * d);
      o.rstdv = f32(bt);
    }
  }
  delta_null_ = config_.delta_null_source ? f32(bt * d) : nullptr;
  delta_dnull_ = delta_gdh_[0] = delta_gdh_[1] = delta_dp_ = nullptr;
  if (!with_grad_) return;
  if (config_.delta_null_source) delta_dnull_ = f32(bt * d);
  if (gated) {
    delta_gdh_[0] = f32(bt * d);
    if (any_value_route) delta_gdh_[1] = f32(bt * d);
  }
  if (vector) delta_dp_ = f32(bt * d);
  if (any_value_route) {  // the V route's dL/dx_V and dL/dh_V (the separate value route's buffers)
    buf_.dxv = f32(bt * d);
    buf_.dhv = f32(bt * d);
  }
}

const float* CudaModel::delta_source(int index) const {
  return index == kDeltaNullSource ? delta_null_ : residual(index);
}

float* CudaModel::delta_dsource(int index) { return index == kDeltaNullSource ? delta_dnull_ : dresidual(index); }

void* CudaModel::delta_value_input(int j) const {
  return delta_ ? delta_opt_[static_cast<std::size_t>(j)].xv : nullptr;
}

// x = RMSNorm(h) with h = x_j + g ⊙ sum_s alpha_s v_s over the sublayer's sources (h = x_j
// without any); with the V route also x_V = RMSNorm(x_j + g ⊙ c_V).
void CudaModel::delta_read_forward(int j, const float* norm_w) {
  Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
  const std::vector<int>& src = delta_src_[static_cast<std::size_t>(j)];
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  if (src.empty()) {  // no sources: no read, no gate
    kern::rmsnorm_forward(s.x, op_type(), s.rstd, delta_stream(j), norm_w, n, d, static_cast<float>(config_.norm_eps),
                          stream_);
    return;
  }
  const DeltaOptions& o = delta_opt_[static_cast<std::size_t>(j)];
  const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  if (o.null_source != nullptr) kern::delta_broadcast(delta_null_, o.null_source, n, d, stream_);
  if (config_.delta_gate == DeltaGate::sigmoid_vector) {  // g = sigmoid(x_j W^T + b)
    gemm_->linear_forward(o.g, DType::f32, delta_stream(j), o.gate, DType::f32, n, d, d);
    kern::delta_gate_vector_forward(o.g, o.gate_bias, n, d, stream_);
  }
  kern::DepthReadForward a;
  a.sources = buf_.delta_sources + static_cast<std::size_t>(j) * delta_max_src_;
  a.n_sources = static_cast<int>(src.size());
  a.n_tok = n;
  a.d = d;
  a.eps = static_cast<float>(config_.norm_eps);
  a.gamma = is_attention(j) ? lw.attn_key_norm : lw.mlp_key_norm;
  a.queries[0] = is_attention(j) ? lw.attn_query : lw.mlp_query;
  a.rms = s.rms;
  a.logits = s.read_logits;
  a.residual = delta_stream(j);
  a.gate = config_.delta_gate;
  a.gate_param = config_.delta_gate == DeltaGate::sigmoid_vector ? o.g : o.gate;
  a.mix = o.c;
  a.h = s.h;
  a.norm_w = norm_w;
  a.x = s.x;
  a.x_type = op_type();
  a.rstd = s.rstd;
  if (o.value_route) {
    a.n_routes = 2;
    a.queries[1] = o.value_query;
    a.gamma1 = o.value_key_norm;
    a.mixv = o.cv;
    a.hv = o.hv;
    a.xv = o.xv;
    a.rstdv = o.rstdv;
  }
  kern::depth_read_forward(a, stream_);
}

// Given dh = dL/dh of sublayer j's read (and, with the V route, dL/dx_V in buf_.dxv): the stream's
// share (dh, dh_V, the vector gate's path) into dstream, the gate's gradients, then the read's with
// g ⊙ dh per route: the sources', the queries' and key norms'; the null source's summed over tokens.
void CudaModel::delta_read_backward(int j, const float* dh) {
  Buffers& b = buf_;
  const Sublayer& s = b.sub[static_cast<std::size_t>(j)];
  const DeltaOptions& o = delta_opt_[static_cast<std::size_t>(j)];
  const LayerWeights<float>& lw = w_.layers[static_cast<std::size_t>(layer_of(j))];
  LayerWeights<float>& lg = g_.layers[static_cast<std::size_t>(layer_of(j))];
  const std::int64_t n = n_tok_;
  const int d = config_.d_model, L = config_.n_sublayers();
  const float* dhv = nullptr;
  if (o.value_route) {  // x_V = RMSNorm(h_V) with the pre-norm's weight
    kern::rmsnorm_backward(b.dhv, false, input_norm(g_, L, j), b.dxv, o.hv, input_norm(w_, L, j), o.rstdv, n, d,
                           b.reduce, stream_);
    dhv = b.dhv;
  }
  kern::add_into(b.dstream, dh, n * d, stream_);  // h = x_j + g c: the stream path
  if (dhv != nullptr) kern::add_into(b.dstream, dhv, n * d, stream_);
  const float* dout[2] = {dh, dhv};
  if (config_.delta_gate != DeltaGate::none) {
    kern::DeltaGateBackward gb;
    gb.gate = config_.delta_gate;
    gb.param = o.gate;
    gb.g = o.g;
    gb.n_routes = o.value_route ? 2 : 1;
    gb.dh[0] = dh;
    gb.dh[1] = dhv;
    gb.c[0] = o.c;
    gb.c[1] = o.cv;
    gb.n_tok = n;
    gb.d = d;
    kern::delta_gate_backward(gb, o.dgate, delta_dp_, b.reduce, stream_);
    if (gb.gate == DeltaGate::sigmoid_vector) {  // p = x_j W^T + b: db, dW += dp^T x_j, dx_j += dp W
      kern::delta_column_sum(o.dgate_bias, delta_dp_, n, d, b.reduce, stream_);
      gemm_->linear_backward_weight(o.dgate, delta_dp_, delta_stream(j), DType::f32, n, d, d);
      gemm_->linear_backward_input(b.dstream, DType::f32, delta_dp_, o.gate, DType::f32, n, d, d, true);
    }
    for (int r = 0; r < gb.n_routes; ++r) {  // the reads' output gradients: g ⊙ dh_r
      kern::delta_gate_scale(delta_gdh_[r], gb.dh[r], gb, stream_);
      dout[r] = delta_gdh_[r];
    }
  }
  if (o.null_source != nullptr) {  // the null source again (a later read's forward overwrote it)
    kern::delta_broadcast(delta_null_, o.null_source, n, d, stream_);
    ATTNRES_CUDA_CHECK(
        cudaMemsetAsync(delta_dnull_, 0, sizeof(float) * static_cast<std::size_t>(n * d), stream_));
  }
  const std::size_t table = static_cast<std::size_t>(j) * delta_max_src_;
  kern::DepthReadBackward a;
  a.sources = b.delta_sources + table;
  a.dsources = b.delta_dsources + table;
  a.n_sources = static_cast<int>(delta_src_[static_cast<std::size_t>(j)].size());
  a.n_tok = n;
  a.d = d;
  a.gamma = is_attention(j) ? lw.attn_key_norm : lw.mlp_key_norm;
  a.queries[0] = is_attention(j) ? lw.attn_query : lw.mlp_query;
  a.rms = s.rms;
  a.logits = s.read_logits;
  a.dout[0] = dout[0];
  a.dqueries[0] = is_attention(j) ? lg.attn_query : lg.mlp_query;
  a.dgamma = is_attention(j) ? lg.attn_key_norm : lg.mlp_key_norm;
  a.scratch = b.reduce;
  if (o.value_route) {
    a.n_routes = 2;
    a.queries[1] = o.value_query;
    a.gamma1 = o.value_key_norm;
    a.dout[1] = dout[1];
    a.dqueries[1] = o.dvalue_query;
    a.dgamma1 = o.dvalue_key_norm;
  }
  kern::depth_read_backward(a, stream_);
  // One vector for every token: its gradient sums over them (chunks of tokens in order).
  if (o.null_source != nullptr) kern::delta_column_sum(o.dnull_source, delta_dnull_, n, d, b.reduce, stream_);
}

}  // namespace attnres::cuda
