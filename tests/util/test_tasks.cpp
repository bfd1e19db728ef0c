// util/tasks.hpp: a loop of tasks forks a team only at the top level, with work and threads to
// spare (a region inside attention's would cost libgomp a team per GEMM); each task runs once.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "util/tasks.hpp"
#include "util/threads.hpp"

using namespace attnres;

TEST(Tasks, ForkOnlyAtTheTopWithWorkAndThreads) {
  const int saved = num_threads();
  set_num_threads(2);
  EXPECT_TRUE(fork_team(true));
  EXPECT_FALSE(fork_team(false));
  bool nested = true;
#pragma omp parallel num_threads(1)
  nested = fork_team(true);  // inside a region, even one of a single thread
  EXPECT_FALSE(nested);
  set_num_threads(1);
  EXPECT_FALSE(fork_team(true));
  set_num_threads(saved);
}

TEST(Tasks, EachTaskRunsOnceOnATeamOrInOrder) {
  const int saved = num_threads();
  for (const int threads : {1, 2, 3})
    for (const bool worth : {false, true}) {
      set_num_threads(threads);
      std::vector<int> runs(1000, 0), team(1000, -1);
      for_each_task(1000, worth, [&](std::int64_t i) {
        ++runs[static_cast<std::size_t>(i)];
        team[static_cast<std::size_t>(i)] = omp_get_num_threads();
      });
      for (std::size_t i = 0; i < runs.size(); ++i) {
        ASSERT_EQ(runs[i], 1) << "task " << i << ", " << threads << " threads";
        EXPECT_EQ(team[i], worth && threads > 1 ? threads : 1) << "task " << i << ", " << threads << " threads";
      }
    }
  set_num_threads(saved);
}
