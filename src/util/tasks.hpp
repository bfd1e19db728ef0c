// Loops of independent tasks that fork an OpenMP team only where it pays.
#pragma once

#include <cstdint>

namespace attnres {

// Whether a loop should fork an OpenMP team: it has the work (`worth`), there is more than one
// thread, and no parallel region encloses it. Entering a region inside another, even one of a
// single thread, costs libgomp a team and futex wake-ups on every call: a sixth of the study
// models' attention time on one thread, whose block GEMMs run inside attention's region.
bool fork_team(bool worth);

// body(i) for i in [0, n): on a team when fork_team(worth), else in order on this thread; either
// way each i runs once, so results that do not depend on the thread count stay so.
template <class Body>
void for_each_task(std::int64_t n, bool worth, const Body& body) {
  if (fork_team(worth)) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) body(i);
  }
}

}  // namespace attnres
