// Parallel loops over independent items whose results land in per-item slots, so the output
// never depends on the thread count or schedule.
#pragma once

#include <cstddef>
#include <exception>
#include <vector>

namespace attnres::data {

// Runs fn(i) for every i in [0, n) on the OpenMP threads. If any call throws, the exception of
// the lowest failing i is rethrown after the loop: the same error a serial loop would report.
template <class Fn>
void parallel_for_each(std::size_t n, Fn&& fn) {
  std::vector<std::exception_ptr> errors(n);
  const auto count = static_cast<long long>(n);
#pragma omp parallel for schedule(dynamic, 1)
  for (long long i = 0; i < count; ++i) {
    try {
      fn(static_cast<std::size_t>(i));
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace attnres::data
