// Causal attention for a model on one stream: picks cuDNN's fused flash attention or the
// project's own kernels (kern::attention_forward/backward, attention*.cu) and keeps what cuDNN
// needs between calls (its handle, one execution plan per shape and direction, the workspace).
// No global state: every CudaModel owns one of these.
//
// Implementations (kern::AttentionImpl):
//   automatic: cuDNN when the build has it (ATTNRES_WITH_CUDNN, docs/cuda.md), the operands are
//              bf16 and head_dim is 64 or 128; otherwise the WMMA (bf16, head_dim 64 / 128) or
//              FMA kernels. When cuDNN has no engine for a shape (answered when the plan is built,
//              on the first call of that shape), that is printed ONCE per shape and direction on
//              stderr, naming the shape, head_dim and cuDNN version, and the shape runs on the WMMA
//              kernels from then on.
//   cudnn:     as automatic, but a build without cuDNN (set_impl) or a bf16 head_dim-64/128 shape
//              cuDNN cannot plan is an error (attnres::Error naming the shape, head_dim and cuDNN
//              version) instead of a fallback. Calls cuDNN does not take here (fp32 operands,
//              other head dims) run on the kernels as under automatic.
//   wmma, simt: the project's kernels (kernels.hpp).
//
// Layouts and semantics are kern::attention_forward/backward's: q, k, v, out [B, T, H*hd]; lse
// [B, H, T] fp32, the natural-log log-sum-exp of each query's scaled, masked scores (what cuDNN
// calls the softmax stats, and what both backward implementations read, so a forward on one
// implementation and a backward on the other agree). delta [B, H, T] fp32 is backward scratch
// (cuDNN writes its dO.O row sums there).
//
// Determinism: cuDNN's backward is asked for its deterministic variant by default (dQ computed
// per query tile from a dP workspace, no atomics), and an engine cuDNN marks NONDETERMINISTIC is
// never chosen for it; docs/cuda.md states its cost.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "cuda/buffer.hpp"
#include "cuda/kernels.hpp"

namespace attnres::cuda {

class Attention {
 public:
  explicit Attention(Stream stream, kern::AttentionImpl impl = kern::AttentionImpl::automatic,
                     bool deterministic = true);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // Whether this build links cuDNN, and its version ("9.19.0": the library loaded at run time,
  // or the headers' version when no GPU call was made yet; "" without cuDNN).
  static bool cudnn_built();
  static std::string cudnn_version();

  kern::AttentionImpl impl() const { return impl_; }
  void set_impl(kern::AttentionImpl impl);
  bool deterministic() const { return deterministic_; }

  // Device bytes held for cuDNN's plans (their shared workspace; 0 before the first cuDNN call).
  std::size_t workspace_bytes() const;

  // The implementation a call with this type and head_dim tries first ("cudnn", "wmma", "simt").
  std::string choice(DType type, int head_dim) const;

  void forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
               const kern::AttentionShape& shape);
  void backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                const void* out, const float* lse, float* delta, DType type, const kern::AttentionShape& shape);

  struct Cudnn;  // internal: cudnn_attention.hpp

 private:
  bool wants_cudnn(DType type, int head_dim) const;
  Cudnn& cudnn();

  Stream stream_;
  kern::AttentionImpl impl_;
  bool deterministic_;
  std::unique_ptr<Cudnn> cudnn_;  // created on the first cuDNN call
};

}  // namespace attnres::cuda
