// Internal to cuda::Attention (attention.hpp): the cuDNN side. Implemented in cudnn_attention.cpp
// when the build found cuDNN (ATTNRES_WITH_CUDNN), else by stubs in attention_runner.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "cuda/attention.hpp"

namespace attnres::cuda {

// One cuDNN handle on the model's stream, the execution plans built so far (one per shape,
// direction and determinism, built on first use and kept: a training step builds none) and
// the workspace they share.
struct Attention::Cudnn {
  Cudnn(Stream stream, bool deterministic);
  ~Cudnn();
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  // The runtime library's version ("9.19.0").
  static std::string version();

  // What a call did: ran (enqueued), or cuDNN has no engine for the shape (its plan could not be
  // built; nothing was enqueued) and why, with first set on the first refusal of that shape and
  // direction (later calls return the cached refusal without trying again). The caller falls
  // back or fails. Errors while executing a plan that was built throw attnres::Error.
  struct Outcome {
    bool ran = true;
    bool first = false;
    std::string why;
  };
  // Device bytes of the workspace the plans share.
  std::size_t workspace_bytes() const;
  // bf16 operands only.
  Outcome forward(void* out, float* lse, const void* q, const void* k, const void* v,
                      const kern::AttentionShape& shape);
  Outcome backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                       const void* out, const float* lse, float* delta, const kern::AttentionShape& shape);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres::cuda
