#include "bench/gemm_rates.hpp"

#include <algorithm>
#include <cblas.h>
#include <chrono>

#include "kernels/gemm.hpp"
#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_f32.hpp"
#include "util/rng.hpp"

namespace attnres::bench {

namespace {

constexpr std::int64_t kSgemmSquare = 1024;  // the fp32 reference's cube

double gemm_rate(bool bf16, const ShapeRate& s, int reps) {
  const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)),
      c(static_cast<std::size_t>(s.m * s.n), 0.0f);
  Rng rng(7, "bench gemm shapes");
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  const float beta = s.pass == "dW" ? 1.0f : 0.0f;
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (bf16) kernels::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
    else if (kernels::own_fp32_gemm())  // what the model's Linear layers run
      kernels::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, beta != 0.0f, c.data(), s.n);
    else kernels::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, sec);
  }
  return 2.0 * double(s.m) * double(s.n) * double(s.k) / best / 1e9;
}

}  // namespace

double sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int reps) {
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(n * k)),
      c(static_cast<std::size_t>(m * n));
  Rng rng(7, "bench gemm");
  for (auto& x : a) x = static_cast<float>(rng.uniform() - 0.5);
  for (auto& x : b) x = static_cast<float>(rng.uniform() - 0.5);
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {  // the first call warms up and is not counted
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), 1.0f, a.data(), static_cast<blasint>(k), b.data(),
                static_cast<blasint>(k), 0.0f, c.data(), static_cast<blasint>(n));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * double(m) * double(n) * double(k) / best / 1e9;
}

GemmRates measure_sgemm_reference(const ModelConfig& c, std::int64_t tokens) {
  GemmRates g;
  g.square = sgemm_gflops(kSgemmSquare, kSgemmSquare, kSgemmSquare, 5);
  g.model = sgemm_gflops(tokens, c.mlp_hidden, c.d_model, 3);
  g.model_shape = shape_text(tokens, c.mlp_hidden, c.d_model);
  return g;
}

std::vector<ShapeRate> measure_linear_shapes(const ModelConfig& c, std::int64_t tokens, int reps) {
  struct Layer {
    const char* name;
    std::int64_t in, out, rows;
  };
  const std::int64_t d = c.d_model, F = c.mlp_hidden, V = c.vocab_size;
  // The LM head runs in chunks of 256 rows (kernels/cross_entropy.cpp, model.cpp's kCrossEntropyRows).
  const Layer layers[] = {{"q/k/v/o", d, d, tokens}, {"mlp gate/up", d, F, tokens}, {"mlp down", F, d, tokens},
                          {"lm head", d, V, std::min<std::int64_t>(tokens, 256)}};
  std::vector<ShapeRate> out;
  for (const Layer& l : layers) {
    // forward y = x W^T; dX = dY W; dW += dY^T X (kernels/gemm.cpp).
    out.push_back({l.name, "forward", l.rows, l.out, l.in, false, true});
    out.push_back({l.name, "dX", l.rows, l.in, l.out, false, false});
    out.push_back({l.name, "dW", l.out, l.in, l.rows, true, false});
  }
  for (auto& s : out) {
    s.fp32 = gemm_rate(false, s, reps);
    s.bf16 = gemm_rate(true, s, reps);
  }
  return out;
}

std::string shape_text(std::int64_t m, std::int64_t n, std::int64_t k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

std::string GemmRate::shape() const { return shape_text(m, n, k); }

RateReference fp32_rate_reference(const GemmRates& sgemm) {
  return {"fp32", {{"attnres", "cblas_sgemm", kSgemmSquare, kSgemmSquare, kSgemmSquare, sgemm.square}}, 0, ""};
}

RateReference best_rate_reference(const std::string& precision, std::vector<GemmRate> candidates, std::string note) {
  RateReference r{precision, std::move(candidates), 0, std::move(note)};
  for (std::size_t i = 1; i < r.candidates.size(); ++i)
    if (r.candidates[i].gflops > r.candidates[r.chosen].gflops) r.chosen = i;
  return r;
}

void keep_better(std::vector<GemmRate>& into, const std::vector<GemmRate>& again) {
  for (const GemmRate& a : again) {
    auto same = std::find_if(into.begin(), into.end(), [&](const GemmRate& g) {
      return g.impl == a.impl && g.op == a.op && g.m == a.m && g.n == a.n && g.k == a.k;
    });
    if (same == into.end()) into.push_back(a);
    else same->gflops = std::max(same->gflops, a.gflops);
  }
}

std::vector<std::array<std::int64_t, 3>> bf16_reference_shapes(const ModelConfig& c, std::int64_t tokens,
                                                               std::int64_t cube) {
  return {{cube, cube, cube}, {tokens, c.mlp_hidden, c.d_model}};
}

std::vector<GemmRate> measure_bf16_rates(const std::vector<std::array<std::int64_t, 3>>& shapes, int reps) {
  std::vector<GemmRate> out;
  for (const auto& [m, n, k] : shapes) {
    const ShapeRate forward{"", "forward", m, n, k, false, true};  // C = A B^T, as a Linear's forward
    out.push_back({"attnres", "kernels::gemm_bf16: " + bf16_backend(), m, n, k, gemm_rate(true, forward, reps)});
  }
  return out;
}

std::string bf16_backend() { return kernels::to_string(kernels::bf16_backend()); }

std::string fp32_gemm_backend() { return kernels::to_string(kernels::fp32_gemm_backend()); }

}  // namespace attnres::bench
