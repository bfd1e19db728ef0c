// Grow-only, 64-byte aligned scratch for the packing kernels (one per thread and use, so a step
// allocates nothing once the buffers have reached their size).
#pragma once

#include <cstdlib>
#include <memory>

#include "util/error.hpp"

namespace attnres::kernels {

template <class T>
class Scratch {
 public:
  T* get(std::size_t n) {
    if (n > cap_) {
      const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      ptr_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      require(ptr_ != nullptr, "out of memory (", bytes, " bytes of kernel scratch)");
      cap_ = n;
    }
    return ptr_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> ptr_;
  std::size_t cap_ = 0;
};

}  // namespace attnres::kernels
