// Fuzz targets for every parser of files attnres reads (docs/reliability.md, "Fuzzing"): the
// safetensors container, the corpus reader (JSONL, text, gzip), TOML training configs, the
// prepared-data manifest and token shards, GPT-2 tokenizer files, and the result JSON files
// (src/results: experiment.json, result.json, train_result.json, summary.json). Each target feeds one input to the parser the way attnres reads it (from a file where
// attnres reads files) and checks the oracles:
//   - bad input raises attnres::Error whose message names the file (or `where`) at fault;
//     any other exception, a crash, a sanitizer report or a hang is a finding;
//   - what parses behaves: a config round-trips through to_toml, a GPT-2 tokenizer that loads
//     decodes every encoding back to its text, a dataset that opens reads its tokens.
// The same functions run under libFuzzer (fuzz/fuzz_main.cpp, `make fuzz`) and, for the seed
// inputs and every saved finding in fuzz/regressions/<target>/, in the test suite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnres::fuzz {

struct Target {
  const char* name;
  // Feeds one input; true when the parser accepted it. Throws std::logic_error when an oracle fails.
  bool (*run)(const std::uint8_t* data, std::size_t size);
  // Small valid inputs made with attnres's own writers (nothing copied from elsewhere).
  std::vector<std::string> (*seeds)();
};

std::span<const Target> targets();
const Target* find_target(const std::string& name);  // nullptr if unknown

}  // namespace attnres::fuzz
