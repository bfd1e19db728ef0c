// The float kernels with vector code of their own, on 8 AVX2 lanes against 16 AVX-512 lanes (the
// same bits: kernels/gemm_f32.hpp, fp32_wide_lanes()), one thread, thread CPU time: SwiGLU's
// forward + backward at the study models' widths (8 x 256 tokens; SwiGLU 320 for d64x12, 640 for
// d128x8) and the softmax rows' exponentials over a vocabulary of 8,192 (exp_shifted, what the
// LM head's cross-entropy takes per token). Needs a CPU with AVX-512 for the 16-lane rows.
// Run:
//   build/bench/attnres_elementwise_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "kernels/fast_math.hpp"
#include "kernels/gemm_f32.hpp"
#include "kernels/swiglu.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

// Picks the lanes (through the fp32 backend, as a training run does); false when the CPU lacks them.
bool use_lanes(benchmark::State& state, int lanes) {
  const k::Fp32Gemm backend = lanes == 16 ? k::Fp32Gemm::avx512 : k::Fp32Gemm::avx2;
  if (!k::fp32_gemm_available(backend) || (lanes == 16 && !k::kWideLanesBuilt)) {
    state.SkipWithError("this CPU or build lacks the instructions (16 lanes: an AVX2 build on an AVX-512 CPU)");
    return false;
  }
  k::set_fp32_gemm_backend(backend);
  return true;
}

std::vector<float> uniform(std::size_t n, double lo, double hi, std::uint64_t seed) {
  attnres::Rng rng(seed, "elementwise bench");
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return x;
}

// Arguments: tokens, SwiGLU width, lanes.
void BM_Swiglu(benchmark::State& state) {
  attnres::set_num_threads(1);
  if (!use_lanes(state, static_cast<int>(state.range(2)))) return;
  const std::int64_t n = state.range(0) * state.range(1);
  const auto size = static_cast<std::size_t>(n);
  const auto gate = uniform(size, -6, 6, 1), up = uniform(size, -1, 1, 2), dact = uniform(size, -1, 1, 3);
  std::vector<float> act(size), dgate(size), dup(size);
  for (auto _ : state) {
    k::swiglu_forward(act.data(), gate.data(), up.data(), n);
    k::swiglu_backward(dgate.data(), dup.data(), dact.data(), gate.data(), up.data(), n);
    benchmark::DoNotOptimize(dup.data());
  }
  k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
  state.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// Arguments: rows, row length, lanes. exp(x - 1) of values in (0, 1] stays in (0, 1], so the rows
// can be transformed again and again in place.
void BM_ExpShifted(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), n = static_cast<int>(state.range(1));
  const bool wide = state.range(2) == 16;
  if (wide && (!k::kWideLanesBuilt || !k::fp32_gemm_available(k::Fp32Gemm::avx512))) {
    state.SkipWithError("16 lanes need an AVX2 build on an AVX-512 CPU");
    return;
  }
  auto x = uniform(static_cast<std::size_t>(rows) * n, 0, 1, 4);
  for (auto _ : state)
    for (int r = 0; r < rows; ++r) {
      float* row = x.data() + static_cast<std::size_t>(r) * n;
      benchmark::DoNotOptimize(k::exp_shifted(row, n, 1.0f, wide));
    }
  state.counters["elements/s"] =
      benchmark::Counter(static_cast<double>(rows) * n, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_Swiglu)
    ->ArgNames({"tokens", "width", "lanes"})
    ->ArgsProduct({{2048}, {320, 640}, {8, 16}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ExpShifted)
    ->ArgNames({"rows", "n", "lanes"})
    ->ArgsProduct({{64}, {8192, 256}, {8, 16}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
