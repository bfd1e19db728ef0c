// `attnres bench`: full training steps (forward, backward, clipping, AdamW) per arm, each arm in
// its own worker process (bench/worker.hpp), against the PyTorch eager implementation of the same
// model (bench/torch_model.py) in the same matmul precision unless told otherwise, with model FLOP
// utilisation (bench/flops.hpp) against a GEMM rate of the step's precision measured in the same
// run (bench/gemm_rates.hpp: fp32 the OpenBLAS sgemm, bf16 the best bf16 GEMM of either side).
// See docs/performance.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/gemm_rates.hpp"
#include "train/train_config.hpp"

namespace attnres::bench {

// The `attnres bench` flags, with their defaults (src/cli/bench_command.cpp documents each).
struct Options {
  TrainConfig base;  // the preset or config file with --set applied
  std::string name;  // the preset's name, or the config file, for the report
  std::vector<std::string> arms;
  std::vector<int> seqs;  // empty: the config's seq_len
  int batch = 0;          // 0: tokens_per_step / seq
  std::int64_t tokens_per_step = 0;  // 0: the config's batch_size * seq_len
  int vocab = 8192;                  // when the config's vocab_size is 0 (taken from data)
  int steps = 6, warmup = 1, rounds = 1;
  int threads = 0;  // 0: all cores
  std::uint64_t seed = 1;
  std::string device = "cpu";  // the attnres side's TrainBackend device
  std::string precision;       // attnres' Linear GEMMs: fp32 | bf16; empty: the config's train.precision
  std::string torch = "auto";  // auto | on | off
  std::string torch_precision = "auto";  // auto (attnres' precision) | fp32 | bf16 (torch.autocast)
  std::string python = "/usr/bin/python3";
  std::string torch_script;  // empty: found from the binary
  bool json_out = false;
  std::string json_file;
  bool gemm_only = false;
  bool paired = true;  // also time every arm against the first one in one process, alternately
  std::int64_t bf16_reference_cube = kBf16ReferenceCube;  // hidden flag: tests time a smaller cube
};

// Runs the benchmark: progress to stderr, the table (or with json_out the JSON object) to stdout.
void run(const Options& options);

}  // namespace attnres::bench
