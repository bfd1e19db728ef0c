// Storage for the large buffers a training step sweeps (parameters, gradients, AdamW's moments,
// the activation arena) on transparent huge pages where the kernel gives them on request.
//
// Debian's default THP mode is "madvise": memory gets 2 MB pages only where the program asks with
// madvise(MADV_HUGEPAGE), and otherwise 4 KB ones. A step walks hundreds of MB of activations,
// far beyond what the TLB covers in 4 KB pages (12 MB on Zen 5), so each new page costs a table
// walk; with 2 MB pages the same TLB covers the whole arena. The request is made before the
// first touch, so the pages are huge from their first fault (and there are 512 times fewer
// faults). Where THP is off ("never"), madvise fails or is ignored and the buffer keeps 4 KB
// pages: nothing else changes, the contents and the arithmetic on them are the same.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace attnres {

inline constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;

// A std::allocator for vectors of trivially copyable values: buffers of at least one huge page
// start on a huge-page boundary, are rounded up to whole huge pages and asked for huge pages;
// smaller ones are cache-line aligned.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    const bool huge = bytes >= kHugePageBytes;
    const std::size_t align = huge ? kHugePageBytes : 64;
    const std::size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
    if (p == nullptr) throw std::bad_alloc();
    if (huge) madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure leaves 4 KB pages
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }

  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace attnres
