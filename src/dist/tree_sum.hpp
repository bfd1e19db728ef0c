// The one summation order for gradients: a fixed binary tree over micro-batches, used both for
// gradient accumulation inside a process and for the reduction across MPI ranks. The tree over
// n leaves splits at the largest power of two below n (6 leaves: ((0+1)+(2+3))+(4+5)). When every
// rank holds a power-of-two number of consecutive micro-batches, the per-rank sums are subtrees of
// that tree, so K ranks reproduce one process's accumulated gradient bit for bit.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "util/error.hpp"

namespace attnres::dist {

// Largest power of two strictly below n (n >= 2).
inline std::size_t split_point(std::size_t n) { return std::bit_floor(n - 1); }

// Sums parts[lo..hi) at element i in tree order.
template <class T>
T tree_sum_at(std::span<const T* const> parts, std::size_t lo, std::size_t hi, std::size_t i) {
  if (hi - lo == 1) return parts[lo][i];
  const std::size_t mid = lo + split_point(hi - lo);
  return tree_sum_at(parts, lo, mid, i) + tree_sum_at(parts, mid, hi, i);
}

// Streams leaves in order and keeps one partial sum per level (a binary counter), so summing n
// vectors costs O(log n) buffers and gives exactly the tree of tree_sum_at.
template <class T>
class PairwiseSum {
 public:
  PairwiseSum() = default;
  // `size`: elements per leaf; `max_leaves`: how many leaves at most (sizes the buffers up front).
  PairwiseSum(std::size_t size, std::size_t max_leaves)
      : size_(size), max_leaves_(max_leaves), levels_(static_cast<std::size_t>(std::bit_width(std::max<std::size_t>(max_leaves, 1)))) {
    for (auto& l : levels_) l.resize(size);
  }

  void reset() { count_ = 0; }
  std::size_t count() const { return count_; }

  // Adds the next leaf. `leaf` is used as scratch (its contents are changed).
  void add(std::span<T> leaf) {
    require(leaf.size() == size_, "PairwiseSum: leaf of ", leaf.size(), " elements, expected ", size_);
    require(count_ < max_leaves_, "PairwiseSum: more than the ", max_leaves_, " leaves it was sized for");
    std::size_t i = count_++;
    std::size_t level = 0;
    for (; i & 1u; i >>= 1, ++level) {  // merge with the stored left sibling of each completed pair
      const T* left = levels_[level].data();
      for (std::size_t k = 0; k < size_; ++k) leaf[k] = left[k] + leaf[k];
    }
    std::copy(leaf.begin(), leaf.end(), levels_[level].begin());
  }

  // The sum of the leaves added since reset(): the stored subtrees, combined from the smallest.
  void result(std::span<T> out) const {
    require(out.size() == size_ && count_ > 0, "PairwiseSum: no leaves or wrong output size");
    bool have = false;
    for (std::size_t level = 0; level < levels_.size(); ++level) {
      if (((count_ >> level) & 1u) == 0) continue;
      const T* part = levels_[level].data();
      if (!have) std::copy(part, part + size_, out.begin());
      else
        for (std::size_t k = 0; k < size_; ++k) out[k] = part[k] + out[k];
      have = true;
    }
  }

 private:
  std::size_t size_ = 0;
  std::size_t max_leaves_ = 0;
  std::size_t count_ = 0;
  std::vector<std::vector<T>> levels_;
};

}  // namespace attnres::dist
