// Provenance: what produced a run, recorded in its train_result.json and result.json as the object
// "provenance": the binary (attnres's version, the commit it was built from and whether tracked
// files had changed: util/build_info.hpp), the GEMM backends and OpenBLAS core it ran, the CPU with
// the flags that decide those backends, and its thread count. The process that trains fills it
// (train() in src/train/trainer.cpp, through process_provenance below); the experiment runner
// copies it into result.json; the summary lists the distinct origins of a comparison's runs and
// notes when they differ. Files written before it was recorded have none. Format:
// docs/experiments.md.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "results/strict_json.hpp"

namespace attnres::results {

struct RunResult;  // results/run_result.hpp

// The CPU flags (/proc/cpuinfo's names) a provenance records, those of them the CPU has, in this
// order: what the fp32 and bf16 GEMM backends are chosen by.
inline constexpr std::array<std::string_view, 6> kProvenanceCpuFlags = {"avx2",        "fma",      "avx512f",
                                                                        "avx512_bf16", "amx_bf16", "amx_tile"};

struct Provenance {
  std::string attnres_version;  // util/build_info.hpp's version, "0.9.0"
  std::string commit;           // 12 hex digits (more or fewer in other builds), or "unknown"
  std::optional<bool> dirty;    // tracked files changed from the commit; nullopt (null): unknown
  std::string device;           // where it trained: "cpu", or the CUDA device as --device named it
  // The CPU's fp32 GEMMs' (kernels::Fp32Gemm's name, "openblas", "avx2" or "avx512"): the model's
  // Linear layers on the CPU, the evaluations and diagnostics of an experiment's runs.
  std::string gemm_backend;
  // The CPU's bf16 GEMMs' (kernels::Bf16Backend's name), for a CPU run with bf16 matmuls only; no
  // key otherwise.
  std::optional<std::string> bf16_backend;
  std::string blas_core;  // openblas_get_corename(), or "unknown"
  std::string cpu_model;  // /proc/cpuinfo's "model name", or "unknown"
  std::vector<std::string> cpu_flags;  // those of kProvenanceCpuFlags the CPU has, in that order
  int threads = 0;                     // OpenMP threads per process during the run
};

// This process's provenance for a run on `device` (TrainRunOptions::device): its build, the backends
// it runs, its CPU and its thread count now (set_num_threads). `bf16_matmuls`: the run's Linear
// GEMMs are bf16, so the CPU's bf16 backend is recorded (on "cpu" only: a CUDA run's run on the GPU).
Provenance process_provenance(const std::string& device, bool bf16_matmuls);

// Reading checks the commit ("unknown" or hex digits), the backends' names, the flags (each one of
// kProvenanceCpuFlags, once) and threads >= 1.
nlohmann::json to_json(const Provenance& p);
void from_json(JsonObject& in, Provenance& p);

// One distinct origin among a comparison's runs, and how many of its finished runs came from it:
// summary.json's "provenance" entries.
struct ProvenanceCount {
  std::string commit;
  std::optional<bool> dirty;
  std::string cpu_model, gemm_backend, blas_core;
  int runs = 0;
};

nlohmann::json to_json(const ProvenanceCount& c);
void from_json(JsonObject& in, ProvenanceCount& c);

// The distinct {commit, dirty, cpu_model, gemm_backend, blas_core} of the runs that record a
// provenance, in the order first seen, each with its run count; empty when none records one.
std::vector<ProvenanceCount> provenance_counts(std::span<const RunResult> runs);

// One line for the report when the runs of one comparison did not all come from the same binary
// (commit or dirty flag), CPU and GEMM setup (backend and OpenBLAS core), or only some of them
// record where they came from, e.g.
//   "the runs came from 2 binaries: 0123456789ab (3 runs), 0123456789ab-dirty (1 run)"
// nullopt when they all agree, and when none records a provenance (files of earlier builds).
std::optional<std::string> provenance_note(std::span<const RunResult> runs);

}  // namespace attnres::results
