// The libFuzzer entry point for every target of fuzz/targets.hpp; the target is named by the
// environment (one binary keeps the build small):
//   ATTNRES_FUZZ_TARGET=NAME attnres_fuzz [libFuzzer flags] CORPUS_DIR...   fuzz NAME
//   ATTNRES_FUZZ_TARGET=NAME attnres_fuzz crash-file                         replay one input
//   ATTNRES_FUZZ_TARGET=NAME ATTNRES_FUZZ_SEEDS=DIR attnres_fuzz             write NAME's seeds to DIR
//   ATTNRES_FUZZ_TARGET=list attnres_fuzz                                    print the target names
// fuzz/run.sh (`make fuzz`) drives it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/targets.hpp"

namespace {
const attnres::fuzz::Target* g_target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("ATTNRES_FUZZ_TARGET");
  if (name != nullptr && std::string(name) == "list") {
    for (const auto& t : attnres::fuzz::targets()) std::printf("%s\n", t.name);
    std::exit(0);
  }
  g_target = name != nullptr ? attnres::fuzz::find_target(name) : nullptr;
  if (g_target == nullptr) {
    std::fprintf(stderr, "attnres_fuzz: set ATTNRES_FUZZ_TARGET to one of:");
    for (const auto& t : attnres::fuzz::targets()) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, " (or 'list')\n");
    std::exit(2);
  }
  if (const char* dir = std::getenv("ATTNRES_FUZZ_SEEDS")) {
    std::filesystem::create_directories(dir);
    int i = 0;
    for (const std::string& seed : g_target->seeds()) {
      std::ofstream out(std::filesystem::path(dir) / ("seed-" + std::to_string(i++)), std::ios::binary);
      out << seed;
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  g_target->run(data, size);
  return 0;
}
