#include "util/threads.hpp"
#include "util/tasks.hpp"

#include <omp.h>

extern "C" void openblas_set_num_threads(int num_threads);

namespace attnres {

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

bool fork_team(bool worth) { return worth && omp_get_level() == 0 && omp_get_max_threads() > 1; }

}  // namespace attnres
