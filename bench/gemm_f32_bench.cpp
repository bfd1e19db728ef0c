// The fp32 Linear GEMMs of the study-size models (issue #32: d64 x 12 and d128 x 8, batch 8 x 256
// = 2,048 tokens, SwiGLU 5d, the LM head's 256-row chunks of a 8,192 vocabulary; and the `small`
// preset's, d 256) on OpenBLAS' sgemm and on the project's own kernel (kernels/gemm_f32.hpp) with
// its AVX2 and, where the CPU has them, its AVX-512 tiles, beside sgemm 1024^3 (the MFU reference
// of `attnres bench`), one thread unless --threads N.
//
// Built for a shared machine: the implementations alternate call by call, and each reports
// its fastest call (GFLOP/s of the minimum time over --reps calls, after a warm-up; with one
// thread the thread's CPU time, else wall time). Single calls last 0.1-5 ms, so the fastest of
// many is the rate of an undisturbed call even while other processes share the cores; the
// median is printed too.
//   build/bench/attnres_gemm_f32_bench [--reps 200] [--threads 1] [--filter d64]
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/gemm_f32.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

struct Shape {
  std::string name;
  bool ta, tb;
  std::int64_t m, n, k;
};

// forward y = x W^T (A B^T), dX = dY W (A B), dW += dY^T X (A^T B), as kernels/gemm.cpp calls them.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  out.push_back({"cube_1024", false, false, 1024, 1024, 1024});
  // Attention's block products at T = 256, head_dim 64 (kernels/attention.cpp): 64 queries against
  // the 256 keys of the last block: S = Q K^T, O = P V, dQ = dS K, dK += dS^T Q.
  out.push_back({"attn_qk", false, true, 64, 256, 64});
  out.push_back({"attn_pv", false, false, 64, 64, 256});
  out.push_back({"attn_dk", true, false, 256, 64, 64});
  out.push_back({"attn_qk64", false, true, 64, 64, 64});
  // The study sizes (2,048 tokens, SwiGLU 5d) and `small` (d 256, 4,096 tokens, SwiGLU 1280).
  for (const auto& [d, f] : {std::pair<std::int64_t, std::int64_t>{64, 320}, {128, 640}, {256, 1280}}) {
    const std::string p = d == 256 ? "small_" : "d" + std::to_string(d) + "_";
    const std::int64_t n = d == 256 ? 4096 : 2048, v = 8192, rows = 256;
    out.push_back({p + "qkvo_fwd", false, true, n, d, d});
    out.push_back({p + "qkvo_dx", false, false, n, d, d});
    out.push_back({p + "qkvo_dw", true, false, d, d, n});
    out.push_back({p + "up_fwd", false, true, n, f, d});
    out.push_back({p + "up_dx", false, false, n, d, f});
    out.push_back({p + "up_dw", true, false, f, d, n});
    out.push_back({p + "down_fwd", false, true, n, d, f});
    out.push_back({p + "down_dx", false, false, n, f, d});
    out.push_back({p + "down_dw", true, false, d, f, n});
    out.push_back({p + "head_fwd", false, true, rows, v, d});
    out.push_back({p + "head_dx", false, false, rows, d, v});
    out.push_back({p + "head_dw", true, false, v, d, rows});
  }
  return out;
}

// Wall time, or with one thread the thread's CPU time (time slices taken by other processes do
// not count; their cache traffic still does).
double now(bool cpu) {
  timespec t{};
  clock_gettime(cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 200, threads = 1;
  bool cold = false;       // write C to a different buffer each call (16 MB in all): C not in cache
  bool cold_all = false;   // and read A and B from different buffers too
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (a == "--cold") cold = true;
    else if (a == "--cold-all") cold = cold_all = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads N] [--filter TEXT] [--cold | --cold-all]\n", argv[0]);
      return 2;
    }
  }
  attnres::set_num_threads(threads);
  const bool cpu_clock = attnres::num_threads() == 1;
  std::vector<k::Fp32Gemm> impls;  // those this CPU has; the ratios are to the first (OpenBLAS)
  for (const k::Fp32Gemm b : {k::Fp32Gemm::openblas, k::Fp32Gemm::avx2, k::Fp32Gemm::avx512})
    if (k::fp32_gemm_available(b)) impls.push_back(b);
  std::printf("threads %d (%s); automatic fp32 GEMM backend: %s; GFLOP/s of the fastest (median) call\n",
              attnres::num_threads(), cpu_clock ? "thread CPU time per call" : "wall time per call",
              k::to_string(k::fp32_gemm_backend()));
  std::printf("%-16s %22s %4s", "shape", "m x n x k", "op");
  for (const k::Fp32Gemm b : impls) std::printf("  %17s", k::to_string(b));
  for (std::size_t i = 1; i < impls.size(); ++i)
    std::printf("  %9s", (std::string(k::to_string(impls[i])) + "/ob").c_str());
  std::printf("\n");
  attnres::Rng rng(7, "gemm bench");
  for (const Shape& s : shapes()) {
    if (!filter.empty() && s.name.find(filter) == std::string::npos && s.name != "cube_1024") continue;
    const auto sets = [&](std::int64_t elems, bool on) {
      return on ? std::max<std::size_t>(1, (std::size_t(16) << 20) / static_cast<std::size_t>(elems)) : std::size_t(1);
    };
    std::vector<float> a(static_cast<std::size_t>(s.m * s.k) * sets(s.m * s.k, cold_all)),
        b(static_cast<std::size_t>(s.k * s.n) * sets(s.k * s.n, cold_all)),
        c(static_cast<std::size_t>(s.m * s.n) * sets(s.m * s.n, cold), 0.0f);
    const std::size_t copies = c.size() / static_cast<std::size_t>(s.m * s.n);
    const std::size_t a_sets = a.size() / static_cast<std::size_t>(s.m * s.k), b_sets = b.size() / static_cast<std::size_t>(s.k * s.n);
    std::size_t next = 0;
    for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
    for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
    const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const bool acc = s.ta;  // the weight gradients accumulate
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const int n = s.name == "cube_1024" ? std::max(10, reps / 10) : reps;
    std::vector<std::vector<double>> t(impls.size());
    for (int r = -3; r < n; ++r)
      for (std::size_t impl = 0; impl < impls.size(); ++impl) {
        const float* aa = a.data() + (next % a_sets) * static_cast<std::size_t>(s.m * s.k);
        const float* bb = b.data() + (next % b_sets) * static_cast<std::size_t>(s.k * s.n);
        float* cc = c.data() + (next++ % copies) * static_cast<std::size_t>(s.m * s.n);
        k::set_fp32_gemm_backend(impls[impl]);
        const double t0 = now(cpu_clock);
        if (impls[impl] == k::Fp32Gemm::openblas)
          k::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, aa, lda, bb, ldb, acc ? 1.0f : 0.0f, cc, s.n);
        else
          k::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, aa, lda, bb, ldb, acc, cc, s.n);
        const double dt = now(cpu_clock) - t0;
        if (r >= 0) t[impl].push_back(dt);
        if (acc) std::fill(cc, cc + s.m * s.n, 0.0f);  // keep the sums bounded
      }
    k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lld", static_cast<long long>(s.m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k));
    std::printf("%-16s %22s %4s", s.name.c_str(), shape, s.ta ? "ATB" : s.tb ? "ABT" : "AB");
    std::vector<double> best(impls.size());
    for (std::size_t impl = 0; impl < impls.size(); ++impl) {
      std::sort(t[impl].begin(), t[impl].end());
      best[impl] = flops / t[impl].front() / 1e9;
      std::printf("  %7.1f (%7.1f)", best[impl], flops / t[impl][t[impl].size() / 2] / 1e9);
    }
    for (std::size_t impl = 1; impl < impls.size(); ++impl) std::printf("  %8.2fx", best[impl] / best[0]);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
