// Depth-read kernels, Block's read against RD's two-route read with the value route's norm
// fused in, at the `small` preset's width (d = 256) and the study models' (d = 64), 4,096 tokens,
// one thread, side by side in one run: what RD adds per attention sublayer outside the GEMMs. Run:
//   build/bench/attnres_depth_read_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
// RD's arm includes the RMSNorm Block runs separately on its read output (rd runs it too, for
// the QK route), so each pair of rows is the whole non-GEMM read cost of one sublayer.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/depth_read.hpp"
#include "kernels/rmsnorm.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

constexpr std::int64_t kTokens = 4096;

struct ReadFixture {
  ReadFixture(int n_sources, bool rd, int d) : n(n_sources), rd(rd), dim(d) {
    attnres::Rng rng(1, "depth read bench");
    auto fill = [&](std::vector<float>& v, std::size_t size) {
      v.resize(size);
      for (auto& x : v) x = static_cast<float>(rng.uniform() * 2 - 1);
    };
    src.resize(static_cast<std::size_t>(n));
    dsrc.resize(static_cast<std::size_t>(n));
    for (int s = 0; s < n; ++s) {
      fill(src[static_cast<std::size_t>(s)], kTokens * dim);
      dsrc[static_cast<std::size_t>(s)].assign(kTokens * dim, 0.0f);
      src_ptr.push_back(src[static_cast<std::size_t>(s)].data());
      dsrc_ptr.push_back(dsrc[static_cast<std::size_t>(s)].data());
    }
    for (auto* v : {&q0, &q1, &gamma, &norm_w, &dq0, &dq1, &dgamma, &dnorm}) fill(*v, dim);
    for (auto* v : {&h, &x, &xv, &dh, &dx, &dxv}) fill(*v, kTokens * dim);
    rms.resize(kTokens * n);
    logits.resize(2 * kTokens * n);
    alpha.resize(2 * kTokens * n);
    rstd.resize(kTokens);
    scratch.resize(static_cast<std::size_t>(
        std::max(k::depth_read_scratch_size(kTokens, dim), k::rmsnorm_scratch_size(kTokens, dim))));
    read.sources = src_ptr.data();
    read.n_sources = n;
    read.n_tok = kTokens;
    read.d = dim;
    read.eps = 1e-6f;
    read.gamma = gamma.data();
    read.queries[0] = q0.data();
    if (rd) {
      read.n_routes = 2;
      read.queries[1] = q1.data();
      read.out_norm[1] = norm_w.data();
    }
  }

  void forward() {
    float* out[] = {h.data(), xv.data()};
    k::depth_read_forward(read, out, rms.data(), logits.data(), alpha.data());
    k::rmsnorm_forward(x.data(), rstd.data(), h.data(), norm_w.data(), kTokens, dim, 1e-6f);
  }

  void backward() {
    k::rmsnorm_backward(dh.data(), dnorm.data(), dx.data(), h.data(), norm_w.data(), rstd.data(), kTokens, dim,
                        scratch.data());
    k::DepthReadGrads<float> g;
    g.dout[0] = dh.data();
    g.dsources = dsrc_ptr.data();
    g.dqueries[0] = dq0.data();
    g.dgamma = dgamma.data();
    if (rd) {
      g.dout[1] = dxv.data();
      g.dqueries[1] = dq1.data();
      g.dout_norm[1] = dnorm.data();
      g.out[1] = dxv.data();  // as the model does: xv over dxv, row by row
    }
    k::depth_read_backward(read, rms.data(), logits.data(), alpha.data(), g, scratch.data());
  }

  int n;
  bool rd;
  int dim;
  std::vector<std::vector<float>> src, dsrc;
  std::vector<const float*> src_ptr;
  std::vector<float*> dsrc_ptr;
  std::vector<float> q0, q1, gamma, norm_w, dq0, dq1, dgamma, dnorm, h, x, xv, dh, dx, dxv, rms, logits,
      alpha, rstd, scratch;
  k::DepthRead<float> read;
};

void BM_ReadForward(benchmark::State& state) {
  attnres::set_num_threads(1);
  ReadFixture f(static_cast<int>(state.range(0)), state.range(1) != 0, static_cast<int>(state.range(2)));
  for (auto _ : state) f.forward();
  state.SetLabel(f.rd ? "rd" : "block");
}

void BM_ReadBackward(benchmark::State& state) {
  attnres::set_num_threads(1);
  ReadFixture f(static_cast<int>(state.range(0)), state.range(1) != 0, static_cast<int>(state.range(2)));
  f.forward();
  for (auto _ : state) f.backward();
  state.SetLabel(f.rd ? "rd" : "block");
}

}  // namespace

// Arguments: sources (the small preset's attention reads have 1-5, d64x12's 1-7), rd (0 = block's
// read), width.
BENCHMARK(BM_ReadForward)->ArgsProduct({{1, 3, 5, 7}, {0, 1}, {64, 256}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ReadBackward)->ArgsProduct({{1, 3, 5, 7}, {0, 1}, {64, 256}})->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
