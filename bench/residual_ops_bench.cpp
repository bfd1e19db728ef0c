// The baseline residual-mixing ops (baselines-spec; DenseFormer, MUDD, HC, mHC, value residual),
// forward + backward of one op per iteration, at the `small` preset's shape (4,096 tokens,
// d = 256), one thread, beside Block's depth read and an RMSNorm for scale. What each mode adds
// per sublayer (HC, mHC, value residual) or per block (DWA, MUDD) outside the GEMMs of the model.
// Run:
//   build/bench/attnres_residual_ops_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "kernels/depth_read.hpp"
#include "kernels/dwa.hpp"
#include "kernels/hyper_connection.hpp"
#include "kernels/mhc.hpp"
#include "kernels/mudd.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/streams.hpp"
#include "kernels/value_residual.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace k = attnres::kernels;

namespace {

constexpr std::int64_t kTokens = 4096;
constexpr int kDim = 256;

struct Buffers {
  attnres::Rng rng{1, "residual ops bench"};
  std::vector<std::vector<float>> store;

  float* random(std::int64_t n, float scale = 1.0f) {
    store.emplace_back(static_cast<std::size_t>(n));
    for (auto& x : store.back()) x = static_cast<float>(rng.uniform() * 2 - 1) * scale;
    return store.back().data();
  }
  float* zeros(std::int64_t n) {
    store.emplace_back(static_cast<std::size_t>(n), 0.0f);
    return store.back().data();
  }
  float* ones(std::int64_t n) {
    store.emplace_back(static_cast<std::size_t>(n), 1.0f);
    return store.back().data();
  }
};

// S sources [kTokens, kDim] and their gradient accumulators.
struct Sources {
  std::vector<const float*> v;
  std::vector<float*> dv;
  Sources(Buffers& b, int n) {
    for (int s = 0; s < n; ++s) {
      v.push_back(b.random(kTokens * kDim));
      dv.push_back(b.zeros(kTokens * kDim));
    }
  }
};

void BM_RmsNorm(benchmark::State& state) {
  attnres::set_num_threads(1);
  Buffers b;
  float *x = b.random(kTokens * kDim), *w = b.ones(kDim), *y = b.zeros(kTokens * kDim), *rstd = b.zeros(kTokens);
  float *dy = b.random(kTokens * kDim), *dx = b.zeros(kTokens * kDim), *dw = b.zeros(kDim);
  float* scratch = b.zeros(k::rmsnorm_scratch_size(kTokens, kDim));
  for (auto _ : state) {
    k::rmsnorm_forward(y, rstd, x, w, kTokens, kDim, 1e-6f);
    k::rmsnorm_backward(dx, dw, dy, x, w, rstd, kTokens, kDim, scratch);
  }
}

void BM_BlockRead(benchmark::State& state) {
  attnres::set_num_threads(1);
  const int n = static_cast<int>(state.range(0));
  Buffers b;
  Sources src(b, n);
  k::DepthRead<float> rd;
  rd.sources = src.v.data();
  rd.n_sources = n;
  rd.n_tok = kTokens;
  rd.d = kDim;
  rd.eps = 1e-6f;
  rd.gamma = b.ones(kDim);
  rd.queries[0] = b.random(kDim, 0.1f);
  float *h = b.zeros(kTokens * kDim), *rms = b.zeros(kTokens * n), *logits = b.zeros(kTokens * n),
        *alpha = b.zeros(kTokens * n);
  float *dh = b.random(kTokens * kDim), *dq = b.zeros(kDim), *dgamma = b.zeros(kDim);
  float* scratch = b.zeros(k::depth_read_scratch_size(kTokens, kDim));
  k::DepthReadGrads<float> g;
  g.dout[0] = dh;
  g.dsources = src.dv.data();
  g.dqueries[0] = dq;
  g.dgamma = dgamma;
  for (auto _ : state) {
    float* out[] = {h, nullptr};
    k::depth_read_forward(rd, out, rms, logits, alpha);
    k::depth_read_backward(rd, rms, logits, alpha, g, scratch);
  }
}

void BM_Dwa(benchmark::State& state) {
  attnres::set_num_threads(1);
  const int n = static_cast<int>(state.range(0));
  Buffers b;
  Sources src(b, n);
  const k::Dwa<float> dwa{src.v.data(), n, kTokens, kDim, b.random(n)};
  float *y = b.zeros(kTokens * kDim), *dy = b.random(kTokens * kDim), *dalpha = b.zeros(n);
  float* scratch = b.zeros(k::dwa_scratch_size(kTokens, n));
  for (auto _ : state) {
    k::dwa_forward(dwa, y);
    k::dwa_backward(dwa, dy, src.dv.data(), dalpha, scratch);
  }
}

void BM_MuddDa(benchmark::State& state) {
  attnres::set_num_threads(1);
  const int S = static_cast<int>(state.range(0)), C = 4, K = k::mudd_hidden_width(C, S, 1, 64);
  Buffers b;
  Sources src(b, S);
  k::MuddDa<float> da;
  da.sources = src.v.data();
  da.n_sources = S;
  da.n_ways = C;
  da.n_tok = kTokens;
  da.d = kDim;
  da.eps = 1e-6f;
  da.x = src.v.back();
  da.hidden = K;
  da.w1 = b.random(K * kDim, 0.06f);
  da.w2 = b.random(C * S * K, 0.05f);
  da.a = b.random(C * S, 0.5f);
  std::vector<float*> out;
  std::vector<const float*> dout;
  for (int c = 0; c < C; ++c) {
    out.push_back(b.zeros(kTokens * kDim));
    dout.push_back(b.random(kTokens * kDim));
  }
  float *dw = b.zeros(kTokens * C * S), *hidden = b.zeros(kTokens * K), *rms = b.zeros(kTokens);
  float* scratch = b.zeros(k::mudd_scratch_size(kTokens, kDim, C, S, K));
  k::MuddGrads<float> g;
  g.dout = dout.data();
  g.dsources = src.dv.data();
  g.dx = src.dv.back();
  g.dw1 = b.zeros(K * kDim);
  g.dw2 = b.zeros(C * S * K);
  g.da = b.zeros(C * S);
  for (auto _ : state) {
    k::mudd_forward(da, out.data(), dw, hidden, rms, scratch);
    k::mudd_backward(da, dw, hidden, rms, g, scratch);
  }
}

// One HC (range 1: dynamic) or mHC module over n = 4 streams, read and write with both backwards.
void BM_HyperConnection(benchmark::State& state) {
  attnres::set_num_threads(1);
  const int n = 4, m = k::stream_coefficient_count(n);
  const bool manifold = state.range(0) == 2, dynamic = state.range(0) == 1;
  Buffers b;
  float *H = b.random(kTokens * n * kDim), *y = b.random(kTokens * kDim), *h = b.zeros(kTokens * kDim);
  float *out = b.zeros(kTokens * n * kDim), *dout = b.random(kTokens * n * kDim), *dH = b.zeros(kTokens * n * kDim);
  float *dh = b.random(kTokens * kDim), *dy = b.zeros(kTokens * kDim), *dbeta = b.zeros(kTokens * n);
  float *coef = b.zeros(kTokens * m), *act = b.zeros(kTokens * m), *rms = b.zeros(kTokens * n);
  std::vector<float> A(n * (n + 1), 0.0f), B(n, 1.0f);
  for (int i = 0; i < n; ++i) A[i * (n + 1) + 1 + i] = 1.0f;
  A[0] = 1.0f;
  k::HyperConnection<float> hc;
  hc.streams = H;
  hc.n_tok = kTokens;
  hc.n = n;
  hc.d = kDim;
  hc.eps = 1e-6f;
  hc.A = A.data();
  hc.B = B.data();
  if (dynamic) {
    hc.w_alpha = b.random((n + 1) * kDim, 0.05f);
    hc.w_beta = b.random(kDim, 0.05f);
    hc.s_alpha = b.ones(1);
    hc.s_beta = b.ones(1);
    hc.norm = b.ones(kDim);
  }
  k::HyperConnectionGrads<float> hg{b.zeros(n * (n + 1)), b.zeros(n), b.zeros((n + 1) * kDim), b.zeros(kDim),
                                    b.zeros(1), b.zeros(1), b.zeros(kDim)};
  k::ManifoldHyperConnection<float> mh;
  mh.streams = H;
  mh.n_tok = kTokens;
  mh.n = n;
  mh.d = kDim;
  mh.eps = 1e-6f;
  mh.phi = b.random(m * n * kDim, 0.02f);
  mh.alpha = b.random(3, 0.01f);
  mh.bias = b.random(m, 3.0f);
  const k::ManifoldHyperConnectionGrads<float> mg{b.zeros(m * n * kDim), b.zeros(3), b.zeros(m)};
  float* scratch = b.zeros(std::max(k::hc_scratch_size(kTokens, n, kDim), k::mhc_scratch_size(kTokens, n, 20)));
  for (auto _ : state) {
    if (manifold) {
      k::mhc_forward(mh, h, coef, act, rms);
      const auto cv = k::mhc_coefficients(mh, coef);
      k::stream_write_forward(out, H, cv, y, kTokens, n, kDim);
      k::stream_write_backward(dy, dbeta, dout, y, cv, kTokens, n, kDim);
      k::mhc_backward(mh, coef, act, rms, dh, dout, dbeta, dH, mg, scratch);
    } else {
      k::hc_forward(hc, h, coef, act, rms, scratch);
      const auto cv = k::hc_coefficients(hc, coef);
      k::stream_write_forward(out, H, cv, y, kTokens, n, kDim);
      k::stream_write_backward(dy, dbeta, dout, y, cv, kTokens, n, kDim);
      k::hc_backward(hc, coef, act, rms, dh, dout, dbeta, dH, hg, scratch);
    }
  }
  state.SetLabel(manifold ? "mhc" : dynamic ? "hc dynamic" : "hc static");
}

void BM_ValueResidual(benchmark::State& state) {
  attnres::set_num_threads(1);
  Buffers b;
  const k::ValueResidual<float> vr{b.random(kTokens * kDim), b.random(kTokens * kDim), kTokens, kDim, 0.4f, 0.6f};
  float *out = b.zeros(kTokens * kDim), *g = b.random(kTokens * kDim), *dvn = b.zeros(kTokens * kDim);
  float *dv1 = b.zeros(kTokens * kDim), *dl = b.zeros(2), *scratch = b.zeros(k::value_residual_scratch_size(kTokens));
  for (auto _ : state) {
    k::value_residual_forward(vr, out);
    k::value_residual_backward(vr, g, dvn, dv1, dl, scratch);
  }
}

}  // namespace

BENCHMARK(BM_RmsNorm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlockRead)->Arg(5)->Unit(benchmark::kMillisecond);  // the small preset's largest attention read
BENCHMARK(BM_Dwa)->Arg(5)->Arg(9)->Unit(benchmark::kMillisecond);  // 1 x 1 DWA after block 4 and 8
BENCHMARK(BM_MuddDa)->Arg(5)->Arg(9)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HyperConnection)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ValueResidual)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
