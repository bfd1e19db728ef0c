// The Gated Residual module (docs/delta-gated-spec.md §2): the spec's vectors G1 (read and write)
// and G2 (the final mixer, read only), float64 finite differences of every input and parameter,
// and results independent of the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/gated_residual.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// One module with its sublayer output y given; loss = sum(up_x * x) + sum(up_out * H') (the final
// mixer: the first term only).
template <class Real>
struct GrCase {
  int n = 3, d = 4, r = 2;
  std::int64_t T = 2;
  bool final_mixer = false;
  Real eps = Real(1e-6);
  std::vector<Real> H, norm, w_down, w_up, w_inject, y, up_x, up_out;

  k::GatedResidual<Real> op() const {
    return {H.data(), T, n, d, r, eps, norm.data(), w_down.data(), w_up.data(),
            final_mixer ? nullptr : w_inject.data()};
  }
};

template <class Real>
struct GrResult {
  std::vector<Real> x, out, rms, p, beta, gate_mean;     // forward
  std::vector<Real> dH, dy, ds, dnorm, dw_down, dw_up, dw_inject;  // backward
};

template <class Real>
GrResult<Real> forward(const GrCase<Real>& c, std::vector<Real>& scratch) {
  GrResult<Real> r;
  r.x.assign(c.T * c.d, Real(0));
  r.rms.assign(c.T * c.n, Real(0));
  r.p.assign(c.T * c.r, Real(0));
  r.beta.assign(c.T * c.n, Real(0));
  r.gate_mean.assign(c.T * c.n, Real(0));
  scratch.assign(k::gr_scratch_size(c.T, c.n, c.d, c.r), Real(0));
  k::gr_read_forward(c.op(), r.x.data(), {r.rms.data(), r.p.data(), r.beta.data(), r.gate_mean.data()},
                     scratch.data());
  if (!c.final_mixer) {
    r.out.assign(c.H.size(), Real(0));
    k::gr_write_forward(r.out.data(), c.H.data(), r.beta.data(), c.y.data(), c.T, c.n, c.d);
  }
  return r;
}

template <class Real>
GrResult<Real> run(const GrCase<Real>& c) {
  std::vector<Real> scratch;
  GrResult<Real> r = forward(c, scratch);
  r.dnorm.assign(c.norm.size(), Real(0));
  r.dw_down.assign(c.w_down.size(), Real(0));
  r.dw_up.assign(c.w_up.size(), Real(0));
  r.dw_inject.assign(c.w_inject.size(), Real(0));
  if (c.final_mixer) {
    r.dH.assign(c.H.size(), Real(0));
  } else {
    r.dH = c.up_out;  // the residual path; the read backward adds the module's part
    r.dy.assign(c.T * c.d, Real(0));
    r.ds.assign(c.T * c.n, Real(0));
    k::gr_write_backward(r.dy.data(), r.ds.data(), c.up_out.data(), c.y.data(), r.beta.data(), c.T, c.n, c.d);
  }
  const k::GatedResidualGrads<Real> g{r.dnorm.data(), r.dw_down.data(), r.dw_up.data(), r.dw_inject.data()};
  k::gr_read_backward(c.op(), {r.rms.data(), r.p.data(), r.beta.data(), nullptr}, c.up_x.data(),
                      c.final_mixer ? nullptr : r.ds.data(), r.dH.data(), g, scratch.data());
  return r;
}

template <class Real>
double loss(const GrCase<Real>& c) {
  std::vector<Real> scratch;
  const GrResult<Real> r = forward(c, scratch);
  double s = weighted_sum(r.x, c.up_x);
  if (!c.final_mixer) s += weighted_sum(r.out, c.up_out);
  return s;
}

// The spec's part G inputs (n = 3, d = 4, r = 2, T = 2).
GrCase<double> spec_g(bool final_mixer) {
  GrCase<double> c;
  c.final_mixer = final_mixer;
  c.H = fill(100, {2, 3, 4});
  c.norm = fill(101, {12}, 0.25);
  c.w_down = fill(102, {2, 12}, 0.5);
  c.w_up = fill(103, {12, 2}, 0.5);
  c.w_inject = fill(104, {3, 12}, 0.5);
  c.y = fill(105, {2, 4});
  c.up_x = fill(106, {2, 4});
  c.up_out = fill(107, {2, 3, 4});
  return c;
}

// G of token 0 from the saved p: sigmoid(W_up SiLU(p)) (the kernel keeps p, not G).
std::vector<double> read_gates_token0(const GrCase<double>& c, const std::vector<double>& p) {
  std::vector<double> G(static_cast<std::size_t>(c.n * c.d));
  for (int e = 0; e < c.n * c.d; ++e) {
    double q = 0;
    for (int j = 0; j < c.r; ++j) q += c.w_up[e * c.r + j] * p[j] / (1 + std::exp(-p[j]));
    G[e] = 1 / (1 + std::exp(-q));
  }
  return G;
}

std::vector<double> slice(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::vector<double>(v.begin() + from, v.begin() + from + n);
}

const std::vector<double> kSpecX = {0.1645879309, 0.180169179, -0.3213867265, 0.3711744692,
                                    0.05229923318, 0.3473215955, 0.351438117, -0.05663976205};
const std::vector<double> kSpecG0 = {0.4970457674, 0.4995284706, 0.4976561208, 0.4993758781,
                                     0.5020249484, 0.5135472772, 0.5074751584, 0.4917483189,
                                     0.498127642,  0.5107472638, 0.4925248416, 0.4858290802};

}  // namespace

TEST(GatedResidual, SpecVectorG1ReadAndWrite) {
  const auto c = spec_g(false);
  const auto r = run(c);
  expect_spec("G1 x", r.x, kSpecX);
  expect_spec("G1 G[token0]", read_gates_token0(c, r.p), kSpecG0);
  for (int i = 0; i < 3; ++i)  // the diagnostics' per-branch mean over channels
    EXPECT_NEAR(r.gate_mean[i], (kSpecG0[4 * i] + kSpecG0[4 * i + 1] + kSpecG0[4 * i + 2] + kSpecG0[4 * i + 3]) / 4,
                1e-9);
  expect_spec("G1 beta", r.beta, {0.7205906454, 1.088459969, 1.305482998, 1.05679189, 0.712408554, 1.061771943});
  expect_spec("G1 checksum(H')", checksum(r.out), -2.014984889);
  expect_spec("G1 g_H[token0]", slice(r.dH, 0, 12),
              {-0.5840514174, 0.4136868249, -0.975840062, -0.4768081312, -0.792324132, -0.06698349796, -0.9213728923,
               -0.4588824174, -0.8054630543, -0.990479043, 0.4252245264, -0.541581443});
  expect_spec("G1 checksum(g_H)", checksum(r.dH), -5.258089514);
  expect_spec("G1 g_y", r.dy,
              {-2.754238289, -0.6919284694, -1.183436994, -2.065678717, -0.2289280459, -2.210570138, 0.1810573737,
               -0.7167661005});
  expect_spec("G1 g_w[0:4]", slice(r.dnorm, 0, 4), {0.09212863623, 0.2613002164, -0.1684466482, 0.05303645364});
  expect_spec("G1 checksum(g_w)", checksum(r.dnorm), -0.03668391637);
  expect_spec("G1 checksum(g_W_down)", checksum(r.dw_down), -0.03195386123);
  expect_spec("G1 checksum(g_W_up)", checksum(r.dw_up), -0.01524714657);
  expect_spec("G1 checksum(g_W_inject)", checksum(r.dw_inject), 0.7913917329);
}

TEST(GatedResidual, SpecVectorG2FinalMixer) {
  const auto c = spec_g(true);
  const auto r = run(c);
  expect_spec("G2 x", r.x, kSpecX);
  expect_spec("G2 G[token0]", read_gates_token0(c, r.p), kSpecG0);
  expect_spec("G2 checksum(g_H)", checksum(r.dH), 0.4226041346);
  expect_spec("G2 checksum(g_w)", checksum(r.dnorm), -0.05403353409);
  expect_spec("G2 checksum(g_W_down)", checksum(r.dw_down), -0.03195386123);
  expect_spec("G2 checksum(g_W_up)", checksum(r.dw_up), -0.01524714657);
}

// Every input and parameter against central differences, with and without the write, at sizes
// where a missed cross-branch term would show (n = 4, d = 6, r = 3, T = 5).
TEST(GatedResidual, FiniteDifferences) {
  for (const bool final_mixer : {false, true}) {
    GrCase<double> c;
    c.n = 4, c.d = 6, c.r = 3, c.T = 5;
    c.final_mixer = final_mixer;
    const std::size_t nd = 24;
    c.H = random_vector<double>(c.T * nd, 1);
    c.norm = random_vector<double>(nd, 2, 0.3);
    c.w_down = random_vector<double>(c.r * nd, 3, 0.5);
    c.w_up = random_vector<double>(nd * c.r, 4, 0.5);
    c.w_inject = random_vector<double>(c.n * nd, 5, 0.5);
    c.y = random_vector<double>(c.T * c.d, 6);
    c.up_x = random_vector<double>(c.T * c.d, 7);
    c.up_out = random_vector<double>(c.T * nd, 8);
    const auto r = run(c);
    auto f = [&] { return loss(c); };
    double worst = 0;
    auto check = [&](const char* what, const std::vector<double>& got, std::vector<double>& x) {
      const double e = max_rel_error(got, numeric_gradient(f, x, 1e-5));  // h: the loss is O(100)
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-8) << what << (final_mixer ? " (final mixer)" : "");
    };
    check("H", r.dH, c.H);
    check("norm", r.dnorm, c.norm);
    check("w_down", r.dw_down, c.w_down);
    check("w_up", r.dw_up, c.w_up);
    if (!final_mixer) {
      check("w_inject", r.dw_inject, c.w_inject);
      check("y", r.dy, c.y);
    }
    std::printf("gated residual%s: max relative error against finite differences %.3g\n",
                final_mixer ? " (final mixer)" : "", worst);
  }
}

// The projections are fixed-block GEMMs and the norm weight's gradient a chunked sum: one and two
// threads give the same bits.
TEST(GatedResidual, ThreadCountIndependent) {
  GrCase<float> c;
  c.n = 4, c.d = 64, c.r = 8, c.T = 300;
  const std::size_t nd = 256;
  c.H = random_vector<float>(c.T * nd, 11);
  c.norm = random_vector<float>(nd, 12, 0.1);
  c.w_down = random_vector<float>(c.r * nd, 13, 0.02);
  c.w_up = random_vector<float>(nd * c.r, 14, 0.02);
  c.w_inject = random_vector<float>(c.n * nd, 15, 0.02);
  c.y = random_vector<float>(c.T * c.d, 16);
  c.up_x = random_vector<float>(c.T * c.d, 17);
  c.up_out = random_vector<float>(c.T * nd, 18);
  GrResult<float> one, two;
  with_threads(1, [&] { one = run(c); });
  with_threads(2, [&] { two = run(c); });
  EXPECT_EQ(one.x, two.x);
  EXPECT_EQ(one.dH, two.dH);
  EXPECT_EQ(one.dnorm, two.dnorm);
  EXPECT_EQ(one.dw_down, two.dw_down);
  EXPECT_EQ(one.dw_up, two.dw_up);
  EXPECT_EQ(one.dw_inject, two.dw_inject);
}
