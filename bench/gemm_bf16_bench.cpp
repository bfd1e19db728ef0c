// The bf16 GEMM backends (kernels/gemm_bf16.hpp) against OpenBLAS' fp32 sgemm on the `small`
// preset's Linear shapes (4,096 tokens, d = 256, SwiGLU 1280, the LM head's 256-row chunks of a
// 8,192 vocabulary) and on 2048^3, one thread unless --threads, side by side in one run. Rates
// are GFLOP/s of wall time ("GFLOPs") and of process CPU time per thread ("GFLOPs_cpu"). Run:
//   build/bench/attnres_gemm_bf16_bench --benchmark_min_time=0.5 [--benchmark_filter=2048]
// A backend the CPU lacks is skipped with a message.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/gemm_bf16.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

struct Shape {
  const char* name;
  bool ta, tb;
  std::int64_t m, n, k;
};

// forward y = x W^T (A B^T), dX = dY W (A B), dW += dY^T X (A^T B), as kernels/gemm.cpp calls them.
const Shape kShapes[] = {
    {"qkvo_fwd", false, true, 4096, 256, 256},    {"qkvo_dx", false, false, 4096, 256, 256},
    {"qkvo_dw", true, false, 256, 256, 4096},     {"up_fwd", false, true, 4096, 1280, 256},
    {"up_dx", false, false, 4096, 256, 1280},     {"up_dw", true, false, 1280, 256, 4096},
    {"down_fwd", false, true, 4096, 256, 1280},   {"down_dx", false, false, 4096, 1280, 256},
    {"down_dw", true, false, 256, 1280, 4096},    {"head_fwd", false, true, 256, 8192, 256},
    {"head_dx", false, false, 256, 256, 8192},    {"head_dw", true, false, 8192, 256, 256},
    {"square_2048", false, false, 2048, 2048, 2048},
};

enum class Impl { sgemm, fallback, avx512_fma, avx512_bf16, amx };

void run(benchmark::State& state, const Shape& s, Impl impl) {
  const k::Bf16Backend backend = impl == Impl::amx           ? k::Bf16Backend::amx
                                 : impl == Impl::avx512_fma  ? k::Bf16Backend::avx512_fma
                                 : impl == Impl::avx512_bf16 ? k::Bf16Backend::avx512_bf16
                                                             : k::Bf16Backend::fallback;
  if (impl != Impl::sgemm && !k::bf16_backend_available(backend)) {
    state.SkipWithError("backend not available on this CPU");
    return;
  }
  const char* threads = std::getenv("ATTNRES_BENCH_THREADS");
  attnres::set_num_threads(threads != nullptr ? std::atoi(threads) : 1);
  attnres::Rng rng(7, "gemm bench");
  const std::int64_t a_size = s.m * s.k, b_size = s.k * s.n;
  std::vector<float> a(static_cast<std::size_t>(a_size)), b(static_cast<std::size_t>(b_size)),
      c(static_cast<std::size_t>(s.m * s.n), 0.0f);
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  const float beta = s.ta ? 1.0f : 0.0f;  // the weight gradients accumulate
  timespec t0{}, t1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  for (auto _ : state) {
    if (impl == Impl::sgemm)
      k::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
    else
      k::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n, backend);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k) * double(state.iterations());
  const double cpu_s = double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  // The rate had every thread had its core to itself (process CPU time / threads): the steadier
  // figure on a shared machine.
  state.counters["GFLOPs_cpu"] = flops / 1e9 / (cpu_s / attnres::num_threads());
}

const int kRegistered = [] {
  const std::pair<Impl, const char*> impls[] = {{Impl::sgemm, "sgemm"},
                                                {Impl::fallback, "fallback"},
                                                {Impl::avx512_fma, "avx512_fma"},
                                                {Impl::avx512_bf16, "avx512_bf16"},
                                                {Impl::amx, "amx"}};
  for (const Shape& s : kShapes)
    for (const auto& [impl, name] : impls)
      benchmark::RegisterBenchmark((std::string(s.name) + "/" + name).c_str(),
                                   [&s, impl = impl](benchmark::State& st) { run(st, s, impl); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
