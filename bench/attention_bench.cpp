// Causal attention alone (kernels/attention.hpp), fp32 on the float models' GEMM backend, one
// thread: forward, and forward + backward as a training step runs them, at the `small` preset's
// heads (4 of 64, one sequence of 256 to 4,096 tokens: figure 4 of docs/performance.md) and at
// the study models' (1 head of 64, 8 sequences of 256). Model FLOPs count the causal half; times
// and rates are on the thread's CPU time.
// Run (ATTNRES_FP32_GEMM=avx512|avx2|openblas picks the backend):
//   build/bench/attnres_attention_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "kernels/attention.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

// Arguments: batch, sequence length, heads (head_dim 64); backward 0 or 1.
void BM_Attention(benchmark::State& state) {
  attnres::set_num_threads(1);
  const int batch = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const int heads = static_cast<int>(state.range(2)), hd = 64, d = heads * hd;
  const bool backward = state.range(3) != 0;
  const std::size_t n = static_cast<std::size_t>(batch) * T * d;
  attnres::Rng rng(1, "attention bench");
  std::vector<float> q(n), kk(n), v(n), dout(n), out(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(static_cast<std::size_t>(batch) * heads * T);
  for (auto* x : {&q, &kk, &v, &dout})
    for (auto& e : *x) e = static_cast<float>(rng.uniform() * 2 - 1);
  const k::AttentionShape shape{batch, T, T, heads, hd, 0};
  for (auto _ : state) {
    k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), shape);
    if (backward)
      k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), kk.data(), v.data(), out.data(),
                            lse.data(), shape);
    benchmark::DoNotOptimize(dq.data());
  }
  // Forward: Q K^T and P V, 2 T^2 hd multiply-adds per head over the causal half; backward twice that.
  const double flops = 4.0 * batch * heads * (static_cast<double>(T) * T / 2) * hd * (backward ? 3 : 1);
  state.counters["GFLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(backward ? "forward + backward" : "forward");
}

}  // namespace

BENCHMARK(BM_Attention)
    ->ArgNames({"batch", "T", "heads", "bwd"})
    ->Args({1, 4096, 4, 0})
    ->Args({1, 4096, 4, 1})
    ->Args({16, 256, 4, 1})
    ->Args({8, 256, 1, 1})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
