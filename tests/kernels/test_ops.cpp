// Finite-difference checks (float64) of every forward/backward op the model uses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "common/test_util.hpp"
#include "kernels/attention.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/embedding.hpp"
#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_f32.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

constexpr double kTol = 1e-7;

TEST(Ops, LinearGradients) {
  const int n = 5, in = 4, out = 3;
  auto x = random_vector<double>(n * in, 1), w = random_vector<double>(out * in, 2);
  auto up = random_vector<double>(n * out, 3);
  std::vector<double> y(n * out);
  auto loss = [&] {
    k::linear_forward(y.data(), x.data(), w.data(), n, in, out);
    return weighted_sum(y, up);
  };
  std::vector<double> dx(n * in), dw(out * in, 0.0);
  k::linear_backward_input(dx.data(), up.data(), w.data(), n, in, out);
  k::linear_backward_weight(dw.data(), up.data(), x.data(), n, in, out);
  EXPECT_LT(max_rel_error(dx, numeric_gradient(loss, x)), kTol);
  EXPECT_LT(max_rel_error(dw, numeric_gradient(loss, w)), kTol);
}

TEST(Ops, FixedSplitLinearsMatchTheLinearsAndIgnoreTheThreadCount) {
  // Sizes above and below the product OpenBLAS would thread on its own (the blocks then run
  // inactive), with row and column remainders.
  for (const auto& shape : {std::tuple{1000, 200, 70}, std::tuple{300, 16, 24}, std::tuple{70, 6, 5}}) {
    // Plain variables, not structured bindings: clang 14 (`make hardening`) cannot capture those.
    const int n = std::get<0>(shape), in = std::get<1>(shape), out = std::get<2>(shape);
    const auto x = converted<float>(random_vector<double>(n * in, 1)), w = converted<float>(random_vector<double>(out * in, 2));
    const auto dy = converted<float>(random_vector<double>(n * out, 3));
    std::vector<float> y_ref(n * out), dx_ref(n * in), dw_ref(out * in, 0.0f);
    k::linear_forward(y_ref.data(), x.data(), w.data(), n, in, out);
    k::linear_backward_input(dx_ref.data(), dy.data(), w.data(), n, in, out);
    k::linear_backward_weight(dw_ref.data(), dy.data(), x.data(), n, in, out);
    std::vector<std::vector<float>> runs;
    for (int t : {1, 2, 3})
      with_threads(t, [&] {
        std::vector<float> y(n * out), dx(n * in), dw(out * in, 0.5f);
        k::linear_forward_fixed(y.data(), x.data(), w.data(), n, in, out);
        k::linear_backward_input_fixed(dx.data(), dy.data(), w.data(), n, in, out);
        k::linear_backward_weight_fixed(dw.data(), dy.data(), x.data(), n, in, out);  // accumulates
        for (float& v : dw) v -= 0.5f;
        EXPECT_LT(max_rel_error(y, y_ref), 1e-6);
        EXPECT_LT(max_rel_error(dx, dx_ref), 1e-6);
        EXPECT_LT(max_rel_error(dw, dw_ref), 1e-5);
        y.insert(y.end(), dx.begin(), dx.end());
        y.insert(y.end(), dw.begin(), dw.end());
        runs.push_back(y);
      });
    EXPECT_EQ(runs[1], runs[0]) << n << " x " << in << " x " << out;
    EXPECT_EQ(runs[2], runs[0]) << n << " x " << in << " x " << out;
  }
}

TEST(Ops, RmsNormGradients) {
  const int n = 70, d = 5;
  auto x = random_vector<double>(n * d, 1), w = random_vector<double>(d, 2), up = random_vector<double>(n * d, 3);
  std::vector<double> y(n * d), rstd(n);
  auto loss = [&] {
    k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-6);
    return weighted_sum(y, up);
  };
  loss();
  std::vector<double> dx(n * d), dw(d, 0.0), scratch(k::rmsnorm_scratch_size(n, d));
  k::rmsnorm_backward(dx.data(), dw.data(), up.data(), x.data(), w.data(), rstd.data(), n, d, scratch.data());
  EXPECT_LT(max_rel_error(dx, numeric_gradient(loss, x)), kTol);
  EXPECT_LT(max_rel_error(dw, numeric_gradient(loss, w)), kTol);
}

TEST(Ops, SwigluGradients) {
  const int n = 40;
  auto gate = random_vector<double>(n, 1, 2.0), upv = random_vector<double>(n, 2), w = random_vector<double>(n, 3);
  std::vector<double> act(n);
  auto loss = [&] {
    k::swiglu_forward(act.data(), gate.data(), upv.data(), n);
    return weighted_sum(act, w);
  };
  std::vector<double> dg(n), du(n);
  k::swiglu_backward(dg.data(), du.data(), w.data(), gate.data(), upv.data(), n);
  EXPECT_LT(max_rel_error(dg, numeric_gradient(loss, gate)), kTol);
  EXPECT_LT(max_rel_error(du, numeric_gradient(loss, upv)), kTol);
}

TEST(Ops, SwigluFloatMatchesDouble) {
  // float has an 8-lane path and a scalar tail (n = 43 covers both); both must agree with double.
  const int n = 43;
  const auto gate = random_vector<double>(n, 4, 6.0), upv = random_vector<double>(n, 5), da = random_vector<double>(n, 6);
  std::vector<double> act(n), dg(n), du(n);
  k::swiglu_forward(act.data(), gate.data(), upv.data(), n);
  k::swiglu_backward(dg.data(), du.data(), da.data(), gate.data(), upv.data(), n);
  const auto to_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto gf = to_f(gate), uf = to_f(upv), af = to_f(da);
  std::vector<float> actf(n), dgf(n), duf(n);
  k::swiglu_forward(actf.data(), gf.data(), uf.data(), n);
  k::swiglu_backward(dgf.data(), duf.data(), af.data(), gf.data(), uf.data(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(actf[i], act[i], 2e-6 * (1 + std::abs(act[i]))) << i;
    EXPECT_NEAR(dgf[i], dg[i], 2e-6 * (1 + std::abs(dg[i]))) << i;
    EXPECT_NEAR(duf[i], du[i], 2e-6 * (1 + std::abs(du[i]))) << i;
  }
}

TEST(Ops, RopeGradientsAndRotateHalfConvention) {
  const int T = 5, heads = 2, hd = 6, d = heads * hd, rows = 2 * T;
  std::vector<double> cos(T * hd / 2), sin(T * hd / 2);
  k::rope_tables(cos.data(), sin.data(), T, hd, 10000.0);
  auto x = random_vector<double>(rows * d, 1), up = random_vector<double>(rows * d, 2);
  std::vector<double> y;
  auto loss = [&] {
    y = x;
    k::rope_forward(y.data(), rows, T, 0, heads, hd, cos.data(), sin.data());
    return weighted_sum(y, up);
  };
  loss();
  // Rotate-half: dim 0 pairs with dim hd/2 of the same head (row 1 = position 1).
  const double angle = 1.0;  // position 1, frequency index 0
  EXPECT_NEAR(y[d + 0], x[d + 0] * std::cos(angle) - x[d + hd / 2] * std::sin(angle), 1e-12);
  EXPECT_NEAR(y[d + hd / 2], x[d + hd / 2] * std::cos(angle) + x[d + 0] * std::sin(angle), 1e-12);
  std::vector<double> dx = up;
  k::rope_backward(dx.data(), rows, T, 0, heads, hd, cos.data(), sin.data());
  EXPECT_LT(max_rel_error(dx, numeric_gradient(loss, x)), kTol);
}

namespace {
// Plain O(T^2) causal attention, as an independent check of the tiled kernel.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& kk,
                                    const std::vector<double>& v, int B, int T, int H, int hd) {
  const int d = H * hd;
  std::vector<double> out(B * T * d, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += q[(b * T + i) * d + h * hd + e] * kk[(b * T + j) * d + h * hd + e];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < hd; ++e) out[(b * T + i) * d + h * hd + e] += s[j] / sum * v[(b * T + j) * d + h * hd + e];
      }
  return out;
}

// One float64 attention problem (batch B, T positions, H heads of hd), its inputs random from
// `seed` on: the kernel's forward as a loss (the output weighted by `up`) and its backward.
struct AttentionProblem {
  int B, T, H, hd, d;
  std::vector<double> q, kk, v, up, out, lse, dq, dk, dv;
  AttentionProblem(int B_, int T_, int H_, int hd_, int seed)
      : B(B_), T(T_), H(H_), hd(hd_), d(H_ * hd_), q(random_vector<double>(B * T * d, seed)),
        kk(random_vector<double>(B * T * d, seed + 1)), v(random_vector<double>(B * T * d, seed + 2)),
        up(random_vector<double>(B * T * d, seed + 3)), out(B * T * d), lse(B * H * T), dq(B * T * d),
        dk(B * T * d), dv(B * T * d) {}
  k::AttentionShape shape() const { return {B, T, T, H, hd, 0}; }
  double loss() {
    k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), shape());
    return weighted_sum(out, up);
  }
  // The forward (checked against naive_attention), then the backward of the loss.
  void forward_backward() {
    loss();
    EXPECT_LT(max_rel_error(out, naive_attention(q, kk, v, B, T, H, hd)), 1e-12);
    k::attention_backward(dq.data(), dk.data(), dv.data(), up.data(), q.data(), kk.data(), v.data(), out.data(),
                          lse.data(), shape());
  }
};
}  // namespace

TEST(Ops, AttentionMatchesNaiveAndGradients) {
  AttentionProblem a(2, 70, 2, 4, 1);  // T > one query block
  a.forward_backward();
  const auto loss = [&] { return a.loss(); };
  EXPECT_LT(max_rel_error(a.dq, numeric_gradient(loss, a.q)), 1e-6);
  EXPECT_LT(max_rel_error(a.dk, numeric_gradient(loss, a.kk)), 1e-6);
  EXPECT_LT(max_rel_error(a.dv, numeric_gradient(loss, a.v)), 1e-6);
}

// Past one key block of the backward (256 keys): its tiles at key offsets > 0. A full numeric
// gradient costs too much here, so directional derivatives: (L(x + e u) - L(x - e u)) / 2e against
// <dL/dx, u> for a random u, per input (central differences: error O(e^2) ~ 1e-10).
TEST(Ops, AttentionGradientsPastOneKeyBlock) {
  AttentionProblem a(1, 300, 2, 4, 11);
  a.forward_backward();
  const double e = 1e-5;
  int seed = 20;
  for (auto [x, grad, name] :
       {std::tuple{&a.q, &a.dq, "q"}, std::tuple{&a.kk, &a.dk, "k"}, std::tuple{&a.v, &a.dv, "v"}}) {
    const auto u = random_vector<double>(a.q.size(), seed++);
    for (int half = 0; half < 2; ++half) {  // u on the first 256 positions, then on the rest
      double directional = 0;
      std::vector<double> w(u.size(), 0.0);
      for (std::size_t i = 0; i < u.size(); ++i)
        if ((static_cast<int>(i) / a.d >= 256) == (half == 1)) w[i] = u[i];
      for (std::size_t i = 0; i < w.size(); ++i) directional += (*grad)[i] * w[i];
      const std::vector<double> x0 = *x;
      for (std::size_t i = 0; i < w.size(); ++i) (*x)[i] = x0[i] + e * w[i];
      const double plus = a.loss();
      for (std::size_t i = 0; i < w.size(); ++i) (*x)[i] = x0[i] - e * w[i];
      const double minus = a.loss();
      *x = x0;
      EXPECT_NEAR((plus - minus) / (2 * e), directional, 1e-7 * (1 + std::abs(directional)))
          << "d" << name << ", positions " << (half == 0 ? "0-255" : "256-299");
    }
  }
}

TEST(Ops, AttentionWithCachedKeysMatchesFullPass) {
  const int B = 2, T = 9, H = 2, hd = 4, d = H * hd;
  auto q = random_vector<double>(B * T * d, 1), kk = random_vector<double>(B * T * d, 2);
  auto v = random_vector<double>(B * T * d, 3);
  std::vector<double> full(B * T * d), lse(B * H * T);
  k::attention_forward(full.data(), lse.data(), q.data(), kk.data(), v.data(), k::AttentionShape{B, T, T, H, hd, 0});
  // The last query alone, at position T-1, against all T cached keys.
  std::vector<double> q_last(B * d), out(B * d), lse1(B * H);
  for (int b = 0; b < B; ++b)
    for (int e = 0; e < d; ++e) q_last[b * d + e] = q[(b * T + T - 1) * d + e];
  k::attention_forward(out.data(), lse1.data(), q_last.data(), kk.data(), v.data(),
                       k::AttentionShape{B, 1, T, H, hd, T - 1});
  for (int b = 0; b < B; ++b)
    for (int e = 0; e < d; ++e) EXPECT_NEAR(out[b * d + e], full[(b * T + T - 1) * d + e], 1e-14);
}

TEST(Ops, CrossEntropyGradients) {
  const int n = 300, d = 4, V = 7;  // n > one chunk of rows
  auto x = random_vector<double>(n * d, 1), w = random_vector<double>(V * d, 2);
  std::vector<std::int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = (i * 5 + 3) % V;
  std::vector<double> logits(256 * V), row_loss(256);
  const k::CrossEntropyScratch<double> scratch{logits.data(), row_loss.data(), 256};
  auto loss = [&] {
    return k::lm_head_cross_entropy<double>(x.data(), w.data(), targets.data(), n, d, V, scratch, 0.0, nullptr,
                                            nullptr) / n;
  };
  // Reference loss computed directly.
  double ref = 0;
  for (int i = 0; i < n; ++i) {
    std::vector<double> z(V, 0.0);
    double mx = -1e300, sum = 0;
    for (int j = 0; j < V; ++j) {
      for (int e = 0; e < d; ++e) z[j] += x[i * d + e] * w[j * d + e];
      mx = std::max(mx, z[j]);
    }
    for (int j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    ref += mx + std::log(sum) - z[targets[i]];
  }
  EXPECT_NEAR(loss(), ref / n, 1e-12);
  std::vector<double> dx(n * d), dw(V * d, 0.0);
  k::lm_head_cross_entropy<double>(x.data(), w.data(), targets.data(), n, d, V, scratch, 1.0 / n, dx.data(),
                                  dw.data());
  EXPECT_LT(max_rel_error(dx, numeric_gradient(loss, x)), kTol);
  EXPECT_LT(max_rel_error(dw, numeric_gradient(loss, w)), kTol);
}

// The fp32 LM head and cross-entropy against float64 on the same (float) inputs, at the study's
// vocabulary plus a tail (8,195: the 8-lane loops and their scalar ends), on every fp32 GEMM
// backend of the machine: the loss, dX and dW within a first-order bound of each rounding step
// (u = 2^-24): the logits' d-term dot products (error Delta <= d u sum |x w|), the exponent
// argument z - max (the max's own Delta, one rounding), exp to 9 u (Ops.FastExpIsAccurate: 5e-7),
// the sum's 8-lane chains of V/8 terms plus 6 roundings, the scale grad/sum and its product, and
// the backward GEMMs (k u sum |g||w|). A missing factor or term of the softmax gradient is far
// outside it.
TEST(Ops, CrossEntropyFp32WithinBoundOfFloat64) {
  const int n = 300, d = 16, V = 8195;  // n > one chunk of 256 rows
  const double u = 0x1p-24, s = 1.0 / n;
  const auto xd = random_vector<double>(n * d, 11), wd = random_vector<double>(V * d, 12);
  std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<std::int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = (i * 7919 + 13) % V;
  // float64 on the float values, with the bound of each output.
  double loss_ref = 0, loss_bound = 0;
  std::vector<double> dx_ref(n * d, 0.0), dx_bound(n * d, 0.0), dw_ref(V * d, 0.0), dw_bound(V * d, 0.0);
  std::vector<double> z(V), delta(V), p(V), err(V);
  for (int i = 0; i < n; ++i) {
    double mx = -1e300, dmax = 0;
    for (int j = 0; j < V; ++j) {
      double zz = 0, mag = 0;
      for (int e = 0; e < d; ++e) {
        zz += double(x[i * d + e]) * double(w[j * d + e]);
        mag += std::fabs(double(x[i * d + e]) * double(w[j * d + e]));
      }
      z[j] = zz;
      delta[j] = d * u * mag;
      mx = std::max(mx, zz);
      dmax = std::max(dmax, delta[j]);
    }
    double sum = 0, worst = 0;
    for (int j = 0; j < V; ++j) {
      sum += std::exp(z[j] - mx);
      err[j] = delta[j] + dmax + u * std::fabs(z[j] - mx) + 9 * u;  // relative, of exp(z - max)
      worst = std::max(worst, err[j]);
    }
    const double sum_err = worst + (V / 8 + 6) * u;
    const int t = targets[i];
    loss_ref += mx + std::log(sum) - z[t];
    loss_bound += dmax + sum_err + delta[t] +
                  u * (std::fabs(mx) + std::fabs(std::log(sum)) + std::fabs(mx + std::log(sum)) + std::fabs(z[t]));
    for (int j = 0; j < V; ++j) {
      p[j] = std::exp(z[j] - mx) / sum;
      const double g = s * (p[j] - (j == t ? 1.0 : 0.0));
      const double dg = s * p[j] * (err[j] + sum_err + 2 * u) + (j == t ? u * std::fabs(g) : 0.0);
      for (int e = 0; e < d; ++e) {
        dx_ref[i * d + e] += g * double(w[j * d + e]);
        dx_bound[i * d + e] += dg * std::fabs(double(w[j * d + e])) + V * u * std::fabs(g * double(w[j * d + e]));
        dw_ref[j * d + e] += g * double(x[i * d + e]);
        dw_bound[j * d + e] += dg * std::fabs(double(x[i * d + e])) + n * u * std::fabs(g * double(x[i * d + e]));
      }
    }
  }
  std::vector<float> logits(256 * V);
  std::vector<double> row_loss(256);
  const k::CrossEntropyScratch<float> scratch{logits.data(), row_loss.data(), 256};
  int checked = 0;
  double avx2_loss = 0;
  std::vector<float> avx2_dx, avx2_dw;
  for (const k::Fp32Gemm gemm : {k::Fp32Gemm::openblas, k::Fp32Gemm::avx2, k::Fp32Gemm::avx512}) {
    if (!k::fp32_gemm_available(gemm)) continue;
    k::set_fp32_gemm_backend(gemm);
    std::vector<float> dx(n * d), dw(V * d, 0.0f);
    const double loss = k::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), n, d, V, scratch,
                                                        float(s), dx.data(), dw.data());
    if (gemm == k::Fp32Gemm::avx2) {
      avx2_loss = loss;
      avx2_dx = dx;
      avx2_dw = dw;
    } else if (gemm == k::Fp32Gemm::avx512 && k::kWideLanesBuilt && !avx2_dx.empty()) {
      // The AVX-512 tiles and the 16-lane softmax rows keep the AVX2 backend's bits.
      EXPECT_EQ(loss, avx2_loss);
      EXPECT_TRUE(same_bits(dx, avx2_dx)) << "dX";
      EXPECT_TRUE(same_bits(dw, avx2_dw)) << "dW";
    }
    EXPECT_LE(std::fabs(loss - loss_ref), loss_bound) << k::to_string(gemm);
    double worst = 0;
    for (int a = 0; a < n * d; ++a) worst = std::max(worst, std::fabs(dx[a] - dx_ref[a]) / dx_bound[a]);
    EXPECT_LE(worst, 1.0) << k::to_string(gemm) << ": dX";
    RecordProperty(std::string(k::to_string(gemm)) + " dX worst error / bound", std::to_string(worst));
    worst = 0;
    for (int a = 0; a < V * d; ++a) worst = std::max(worst, std::fabs(dw[a] - dw_ref[a]) / dw_bound[a]);
    EXPECT_LE(worst, 1.0) << k::to_string(gemm) << ": dW";
    RecordProperty(std::string(k::to_string(gemm)) + " dW worst error / bound", std::to_string(worst));
    ++checked;
  }
  k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
  EXPECT_GT(checked, 0);
}

TEST(Ops, EmbeddingGradients) {
  const int n = 12, d = 40, V = 5;  // d > one column block
  auto table = random_vector<double>(V * d, 1), up = random_vector<double>(n * d, 2);
  std::vector<std::int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 3) % V;
  std::vector<double> out(n * d);
  auto loss = [&] {
    k::embedding_forward(out.data(), tokens.data(), table.data(), n, d);
    return weighted_sum(out, up);
  };
  std::vector<double> dtable(V * d, 0.0);
  k::embedding_backward(dtable.data(), tokens.data(), up.data(), n, d);
  EXPECT_LT(max_rel_error(dtable, numeric_gradient(loss, table)), kTol);
}

TEST(Ops, FastExpIsAccurate) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
    const double ref = std::exp(double(x));
    worst = std::max(worst, std::abs(double(kernels::exp_fast(x)) - ref) / ref);
  }
  EXPECT_LT(worst, 5e-7);  // a few ulp of float
  EXPECT_EQ(kernels::exp_fast(0.0f), 1.0f);
  EXPECT_LT(kernels::exp_fast(-1e30f), 1e-37f);  // -inf-like inputs underflow to ~0
}

namespace {
// Arguments for the lane comparisons: spread over exp's whole range (the clamps at -87 and 88
// included), small ones, and the special values, in a random order.
std::vector<float> lane_test_inputs(std::size_t n, std::uint64_t seed) {
  const auto wide = random_vector<double>(n, seed, 120.0), small = random_vector<double>(n, seed + 1, 2.0);
  const float special[] = {0.0f, -0.0f, 87.0f, -87.0f, 88.0f, -88.0f, 87.5f, -87.5f, 1e-30f, -1e-30f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = i % 7 == 3 ? special[(i / 7) % std::size(special)] : static_cast<float>(i % 2 == 0 ? wide[i] : small[i]);
  return x;
}

}  // namespace

// The avx512 fp32 backend runs SwiGLU on 16 lanes (kernels/swiglu.cpp), avx2 on 8; the training
// hashes of tests/model/test_fp32_golden.cpp hold for both only if every element has the same
// bits. Lengths cover every tail of 8 and 16, the scalar tail, and several tasks of 4,096.
TEST(FastMath, SwigluOnSixteenLanesGivesEightLanesBits) {
  if (!k::kWideLanesBuilt || !k::fp32_gemm_available(k::Fp32Gemm::avx512) || !k::fp32_gemm_available(k::Fp32Gemm::avx2))
    GTEST_SKIP() << "needs an AVX2 build (-march=native) on a CPU with AVX-512 F/BW/VL/DQ";
  std::vector<std::int64_t> lengths;
  for (std::int64_t n = 1; n <= 40; ++n) lengths.push_back(n);
  for (std::int64_t n : {1000, 4096, 4104, 8192 + 13, 70001}) lengths.push_back(n);
  for (const std::int64_t n : lengths) {
    const auto size = static_cast<std::size_t>(n);
    const auto gate = lane_test_inputs(size, 11), up = lane_test_inputs(size, 12), dact = lane_test_inputs(size, 13);
    std::vector<float> act[2], dgate[2], dup[2];
    for (int wide = 0; wide < 2; ++wide) {
      k::set_fp32_gemm_backend(wide != 0 ? k::Fp32Gemm::avx512 : k::Fp32Gemm::avx2);
      ASSERT_EQ(k::fp32_wide_lanes(), wide != 0);
      act[wide].assign(size, -1.0f);
      dgate[wide].assign(size, -1.0f);
      dup[wide].assign(size, -1.0f);
      k::swiglu_forward(act[wide].data(), gate.data(), up.data(), n);
      k::swiglu_backward(dgate[wide].data(), dup[wide].data(), dact.data(), gate.data(), up.data(), n);
    }
    k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
    EXPECT_TRUE(same_bits(act[0], act[1])) << "forward, n = " << n;
    EXPECT_TRUE(same_bits(dgate[0], dgate[1])) << "dgate, n = " << n;
    EXPECT_TRUE(same_bits(dup[0], dup[1])) << "dup, n = " << n;
  }
}

// exp_shifted on 16 lanes against 8 (the fp32 softmax rows of attention and the cross-entropy):
// the stored exponentials and their sum, bit for bit, for every tail and a vocabulary-sized row.
TEST(FastMath, ExpShiftedOnSixteenLanesGivesEightLanesBits) {
  if (!k::kWideLanesBuilt || !k::fp32_gemm_available(k::Fp32Gemm::avx512))
    GTEST_SKIP() << "needs an AVX2 build (-march=native) on a CPU with AVX-512 F/BW/VL/DQ";
  std::vector<int> lengths;
  for (int n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int n : {256, 8192, 8197}) lengths.push_back(n);
  for (const int n : lengths)
    for (const float shift : {0.0f, 3.5f, -20.0f}) {
      // Logits as a softmax sees them (finite, mostly near the shift), and the full test range.
      for (const bool finite : {true, false}) {
        auto x = finite ? converted<float>(random_vector<double>(static_cast<std::size_t>(n), 21, 8.0))
                        : lane_test_inputs(static_cast<std::size_t>(n), 22);
        auto y = x;
        const float narrow = k::exp_shifted(x.data(), n, shift, false), wide = k::exp_shifted(y.data(), n, shift, true);
        EXPECT_TRUE(same_bits(std::vector<float>{narrow}, std::vector<float>{wide}))
            << "sum, n = " << n << ", shift " << shift << ": " << narrow << " vs " << wide;
        EXPECT_TRUE(same_bits(x, y)) << "values, n = " << n << ", shift " << shift;
      }
    }
}
