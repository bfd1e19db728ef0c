// `attnres bench --device`: a device this process cannot use stops the run with a clear error
// before any measurement (the bench's output and numbers are covered by the bench_smoke test).
#include <gtest/gtest.h>

#include <string>

#include "common/cli_util.hpp"
#include "train/backend.hpp"

namespace attnres {
namespace {

using testing::run_cli;

const std::string kTinyBench =
    "bench --preset tiny --vocab 512 --arms block --seq 16 --batch 1 --steps 1 --warmup 0 --torch off --no-paired";

TEST(BenchCli, AnUnknownDeviceIsAnError) {
  const testing::CliResult r = run_cli(kTinyBench + " --device tpu");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--device must be cpu, cuda or cuda:N (got 'tpu')"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("sgemm"), std::string::npos) << "measured before failing:\n" << r.output;
}

TEST(BenchCli, CudaWithoutAGpuStopsBeforeAnyWork) {
  const testing::CliResult r = run_cli(kTinyBench + " --device cuda --json");
  if (cuda_backend_built() && r.exit_code == 0) {  // a GPU is visible: the CUDA backend was timed
    EXPECT_NE(r.output.find("\"device\": \"cuda\""), std::string::npos) << r.output;
    return;
  }
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const char* why = cuda_backend_built() ? "--device cuda: no CUDA GPU is visible"
                                         : "--device cuda: this attnres was built without the CUDA backend";
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("sgemm"), std::string::npos) << "measured before failing:\n" << r.output;
}

}  // namespace
}  // namespace attnres
