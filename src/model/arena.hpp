// The activation arena: every activation of a model lives in one buffer sized up front for
// (max_batch, max_seq), so a step allocates nothing. Its owners (the model, the sublayer bodies,
// the trunk) each lay their buffers out in it with an ArenaCarver.
#pragma once

#include <cstdint>

namespace attnres {

// Hands out consecutive slices of the activation arena; with base == nullptr it only counts, so one
// pass sizes the arena and a second lays it out.
template <class Real>
struct ArenaCarver {
  Real* base = nullptr;
  std::int64_t used = 0;
  Real* take(std::int64_t n) {
    Real* p = base != nullptr ? base + used : nullptr;
    used += n;
    return p;
  }
};

}  // namespace attnres
