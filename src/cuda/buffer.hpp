// Owning device and pinned-host allocations (move-only RAII) and the element types the CUDA
// backend stores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace attnres::cuda {

// Element type of a tensor on the device. bf16 is stored as 16-bit patterns (__nv_bfloat16 in
// kernels); host code never touches bf16 values directly.
enum class DType { f32, bf16 };
inline std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* to_string(DType t);

// cudaMalloc'd bytes, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  void reset() { *this = DeviceBuffer(); }
  void swap(DeviceBuffer& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// cudaMallocHost'd (page-locked) bytes, for asynchronous uploads.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept { swap(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    PinnedBuffer tmp(std::move(other));
    swap(tmp);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  void swap(PinnedBuffer& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace attnres::cuda
