// The fuzz targets (fuzz/targets.hpp) in the ordinary test suite: every target accepts its own
// seeds, and every input a fuzzer ever found a problem with (fuzz/regressions/<target>/) runs
// through its target without an oracle failure, an unexpected exception or (under `make
// sanitize`) a sanitizer report.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "fuzz/targets.hpp"

namespace fs = std::filesystem;
using attnres::fuzz::Target;

namespace {

bool run(const Target& t, const std::string& input) {
  return t.run(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const fs::path kRegressions = fs::path(ATTNRES_SOURCE_DIR) / "fuzz" / "regressions";

}  // namespace

TEST(FuzzTargets, AcceptTheirSeeds) {
  for (const Target& t : attnres::fuzz::targets()) {
    const std::vector<std::string> seeds = t.seeds();
    EXPECT_FALSE(seeds.empty()) << t.name;
    for (std::size_t i = 0; i < seeds.size(); ++i) EXPECT_TRUE(run(t, seeds[i])) << t.name << " seed " << i;
    EXPECT_NO_THROW(run(t, "")) << t.name;
  }
}

// Found by reading the parsers for the fuzzers: `attnres prepare` on a JSONL line whose "id" was an
// array nested 10^6 deep died of a stack overflow (printing the id as its split key recursed once
// per level). Too large to keep as files (and beyond libFuzzer's input lengths), so made here:
// every JSON-reading target must refuse such input cleanly.
TEST(FuzzTargets, DeeplyNestedJsonIsRefusedNotAStackOverflow) {
  const std::size_t n = 300000;
  const std::string deep = std::string(n, '[') + std::string(n, ']');
  const std::string header = "{\"a\": " + deep + "}";
  std::string safetensors(8, '\0');
  const std::uint64_t size = header.size();
  std::memcpy(safetensors.data(), &size, 8);
  safetensors += header;
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"corpus", std::string(1, '\0') + "{\"id\": " + deep + ", \"text\": \"x\"}\n"},
      {"safetensors", safetensors},
      {"manifest", "{\"format\": \"attnres-token-shards\", \"x\": " + deep + "}"},
      {"gpt2", "{\"a\": " + deep + "}" + std::string(1, '\0')},
      {"experiment_spec", "{\"version\": 1, \"model\": " + deep + "}"},
      {"run_result", "{\"arm\": " + deep + "}"},
      {"train_result", "{\"params\": 1, \"curve\": " + deep + "}"},
      {"summary", "{\"experiment\": " + deep + "}"},
  };
  for (const auto& [name, input] : inputs) {
    const Target* t = attnres::fuzz::find_target(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_FALSE(run(*t, input)) << name;
  }
}

TEST(FuzzTargets, RegressionInputsRunClean) {
  ASSERT_TRUE(fs::is_directory(kRegressions)) << kRegressions;
  std::set<std::string> names;
  for (const Target& t : attnres::fuzz::targets()) names.insert(t.name);
  int inputs = 0;
  for (const auto& dir : fs::directory_iterator(kRegressions)) {
    if (!dir.is_directory()) continue;
    const std::string name = dir.path().filename().string();
    const Target* t = attnres::fuzz::find_target(name);
    ASSERT_NE(t, nullptr) << "fuzz/regressions/" << name << " names no fuzz target";
    for (const auto& file : fs::directory_iterator(dir.path())) {
      SCOPED_TRACE(file.path().string());
      EXPECT_NO_THROW(run(*t, read_all(file.path())));
      ++inputs;
    }
  }
  std::printf("ran %d regression inputs\n", inputs);
}
