// cuda::Attention (attention.hpp): which implementation runs a call, and the logged fallback
// from cuDNN to the WMMA kernels.
#include <cstdio>
#include <string>

#include "cuda/attention.hpp"
#include "cuda/cudnn_attention.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

namespace kern {

const char* to_string(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::automatic: return "auto";
    case AttentionImpl::simt: return "simt";
    case AttentionImpl::wmma: return "wmma";
    case AttentionImpl::cudnn: return "cudnn";
  }
  ATTNRES_UNREACHABLE("bad AttentionImpl");
}

AttentionImpl parse_attention_impl(const std::string& name) {
  for (AttentionImpl i : {AttentionImpl::automatic, AttentionImpl::cudnn, AttentionImpl::wmma, AttentionImpl::simt})
    if (name == to_string(i)) return i;
  fail("unknown attention implementation '", name, "' (expected auto, cudnn, wmma or simt)");
}

}  // namespace kern

#if !ATTNRES_WITH_CUDNN
// Built without cuDNN: Attention never creates a Cudnn (cudnn_built() is false).
Attention::Cudnn::Cudnn(Stream, bool) {}
Attention::Cudnn::~Cudnn() = default;
std::string Attention::Cudnn::version() { return ""; }
Attention::Cudnn::Outcome Attention::Cudnn::forward(void*, float*, const void*, const void*, const void*,
                                                    const kern::AttentionShape&) {
  return {false, true, "this build has no cuDNN"};
}
Attention::Cudnn::Outcome Attention::Cudnn::backward(void*, void*, void*, const void*, const void*, const void*,
                                                     const void*, const void*, const float*, float*,
                                                     const kern::AttentionShape&) {
  return {false, true, "this build has no cuDNN"};
}
struct Attention::Cudnn::Impl {};
std::size_t Attention::Cudnn::workspace_bytes() const { return 0; }
bool Attention::cudnn_built() { return false; }
#else
bool Attention::cudnn_built() { return true; }
#endif

std::string Attention::cudnn_version() { return Cudnn::version(); }

Attention::Attention(Stream stream, kern::AttentionImpl impl, bool deterministic)
    : stream_(stream), impl_(impl), deterministic_(deterministic) {
  set_impl(impl);
}

Attention::~Attention() = default;

void Attention::set_impl(kern::AttentionImpl impl) {
  require(impl != kern::AttentionImpl::cudnn || cudnn_built(),
          "attention implementation 'cudnn': this build has no cuDNN (docs/cuda.md: ATTNRES_CUDNN_ROOT)");
  impl_ = impl;
}

bool Attention::wants_cudnn(DType type, int head_dim) const {
  // cuDNN's fused attention takes bf16 with head_dim 64 or 128 here (the shapes the WMMA kernels
  // also take, so a refusal can fall back to them).
  const bool eligible = kern::attention_has_wmma(type, head_dim);
  return eligible && cudnn_built() &&
         (impl_ == kern::AttentionImpl::cudnn || impl_ == kern::AttentionImpl::automatic);
}

std::string Attention::choice(DType type, int head_dim) const {
  if (wants_cudnn(type, head_dim)) return "cudnn";
  if (impl_ == kern::AttentionImpl::simt) return "simt";
  return kern::attention_has_wmma(type, head_dim) ? "wmma" : "simt";
}

std::size_t Attention::workspace_bytes() const { return cudnn_ ? cudnn_->workspace_bytes() : 0; }

Attention::Cudnn& Attention::cudnn() {
  if (!cudnn_) cudnn_ = std::make_unique<Cudnn>(stream_, deterministic_);
  return *cudnn_;
}

namespace {

// What a cuDNN refusal becomes: an error under impl cudnn, else a fallback printed once.
bool refused(const Attention::Cudnn::Outcome& o, bool forced, const char* direction, const kern::AttentionShape& s) {
  if (o.ran) return false;
  const std::string what = concat("cuDNN attention ", direction, " (batch ", s.batch, ", seq ", s.seq, ", heads ",
                                  s.n_heads, ", head_dim ", s.head_dim, ", bf16, causal; cuDNN ",
                                  Attention::cudnn_version(), "): ", o.why);
  require(!forced, what);
  if (o.first) std::fprintf(stderr, "attnres: %s; this shape runs on the WMMA kernels\n", what.c_str());
  return true;
}

}  // namespace

void Attention::forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
                        const kern::AttentionShape& shape) {
  const bool forced = impl_ == kern::AttentionImpl::cudnn;
  if (wants_cudnn(type, shape.head_dim)) {
    if (!refused(cudnn().forward(out, lse, q, k, v, shape), forced, "forward", shape)) return;
  }
  const auto impl = impl_ == kern::AttentionImpl::cudnn ? kern::AttentionImpl::automatic : impl_;
  kern::attention_forward(out, lse, q, k, v, type, shape, stream_, impl);
}

void Attention::backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                         const void* out, const float* lse, float* delta, DType type,
                         const kern::AttentionShape& shape) {
  const bool forced = impl_ == kern::AttentionImpl::cudnn;
  if (wants_cudnn(type, shape.head_dim)) {
    if (!refused(cudnn().backward(dq, dk, dv, dout, q, k, v, out, lse, delta, shape), forced, "backward", shape))
      return;
  }
  const auto impl = impl_ == kern::AttentionImpl::cudnn ? kern::AttentionImpl::automatic : impl_;
  kern::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, delta, type, shape, stream_, impl);
}

}  // namespace attnres::cuda
