// DenseFormer's DWA (baselines-spec §1): the spec's vectors A1-A3, finite differences, float
// against double, thread-count bit identity and the identity-init invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/dwa.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// Sources stored one after another ([S, n_tok, d]), as the spec's fill lays them out.
template <class Real>
std::vector<const Real*> rows_of(const std::vector<Real>& x, int n, std::int64_t stride) {
  std::vector<const Real*> p;
  for (int s = 0; s < n; ++s) p.push_back(x.data() + s * stride);
  return p;
}

template <class Real>
std::vector<Real*> rows_of(std::vector<Real>& x, int n, std::int64_t stride) {
  std::vector<Real*> p;
  for (int s = 0; s < n; ++s) p.push_back(x.data() + s * stride);
  return p;
}

}  // namespace

TEST(Dwa, SpecVectorA1) {
  const int S = 3, T = 2, d = 4;
  auto X = fill(1, {S, T, d});
  auto alpha = fill(2, {S}, 0.5);
  auto gY = fill(3, {T, d});
  ASSERT_EQ(alpha, (std::vector<double>{-0.1875, 0.375, -0.4375}));
  auto src = rows_of(X, S, T * d);
  k::Dwa<double> dwa{src.data(), S, T, d, alpha.data()};
  std::vector<double> Y(T * d), gX(S * T * d, 0.0), galpha(S, 0.0), scratch(k::dwa_scratch_size(T, S));
  k::dwa_forward(dwa, Y.data());
  auto dsrc = rows_of(gX, S, T * d);
  k::dwa_backward(dwa, gY.data(), dsrc.data(), galpha.data(), scratch.data());
  expect_spec("A1 Y", Y,
              {-0.1171875, -0.046875, -0.03125, 0.0078125, -0.3828125, -0.0625, -0.1484375, -0.1640625});
  expect_spec("A1 galpha", galpha, {-0.703125, -0.90625, 0.6875});
  expect_spec("A1 checksum(gX)", checksum(gX), -0.5927734375);
}

TEST(Dwa, FillMatchesTheSpecSanityCheck) {
  EXPECT_EQ(fill(1, {5}), (std::vector<double>{0.375, -0.625, -0.125, 0.5, -0.125}));
}

TEST(Dwa, SpecVectorA2Schedules) {
  using V = std::vector<int>;
  // L = 12, k = 4, p = 1: every block, sources j = i (mod 4).
  EXPECT_EQ(k::dwa_sources(4, 4, 1), (V{0, 4}));
  EXPECT_EQ(k::dwa_sources(8, 4, 1), (V{0, 4, 8}));
  EXPECT_EQ(k::dwa_sources(12, 4, 1), (V{0, 4, 8, 12}));
  EXPECT_EQ(k::dwa_sources(5, 4, 1), (V{1, 5}));
  EXPECT_EQ(k::dwa_sources(9, 4, 1), (V{1, 5, 9}));
  EXPECT_EQ(k::dwa_sources(1, 4, 1), (V{1}));
  EXPECT_EQ(k::dwa_sources(3, 4, 1), (V{3}));
  EXPECT_EQ(k::dwa_sources(11, 4, 1), (V{3, 7, 11}));
  for (int i = 1; i <= 12; ++i) EXPECT_EQ(static_cast<int>(k::dwa_sources(i, 4, 1).size()), i / 4 + 1) << i;
  // L = 12, k = 4, p = 5: {5: [1, 5], 10: [2, 6, 10]}.
  std::map<int, V> got;
  for (int i = 1; i <= 12; ++i)
    if (k::dwa_after_block(i, 5)) got[i] = k::dwa_sources(i, 4, 5);
  EXPECT_EQ(got, (std::map<int, V>{{5, {1, 5}}, {10, {2, 6, 10}}}));
  // L = 6, k = 2, p = 3: {3: [1, 3], 6: [0, 2, 4, 6]}.
  got.clear();
  for (int i = 1; i <= 6; ++i)
    if (k::dwa_after_block(i, 3)) got[i] = k::dwa_sources(i, 2, 3);
  EXPECT_EQ(got, (std::map<int, V>{{3, {1, 3}}, {6, {0, 2, 4, 6}}}));
  EXPECT_TRUE(k::dwa_sources(4, 2, 3).empty());
  // Parameter counts (spec §1.3, §6.3): L(L+3)/2 for 1 x 1; 9 and 15 for 4 x 5 at L = 16 and 24.
  EXPECT_EQ(k::dwa_parameter_count(16, 1, 1), 16 * 19 / 2);
  EXPECT_EQ(k::dwa_parameter_count(24, 1, 1), 24 * 27 / 2);
  EXPECT_EQ(k::dwa_parameter_count(16, 4, 5), 9);
  EXPECT_EQ(k::dwa_parameter_count(24, 4, 5), 15);
}

namespace {

// The spec's A3 toy stack: B_i(y) = y + tanh(y W_i) (W_i: 3 x 3, right-multiplied), a DWA after
// every block the schedule names, loss sum G * Y_L. The backward follows spec §1.2: one gradient
// accumulator per block output, visited from the top.
struct ToyStack {
  int L = 0, dilation = 1, period = 1, T = 2, d = 3;
  std::vector<double> E, G;
  std::vector<std::vector<double>> W, alpha;  // W[1..L], alpha[i] for DWA blocks

  std::vector<double> block(const std::vector<double>& y, const std::vector<double>& w) const {
    std::vector<double> x = y;
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < d; ++c) {
        double u = 0;
        for (int e = 0; e < d; ++e) u += y[t * d + e] * w[e * d + c];
        x[t * d + c] += std::tanh(u);
      }
    return x;
  }

  // Returns Y_L; fills X (block outputs, X[0] = E) and Y (block inputs of the next block).
  std::vector<double> forward(std::vector<std::vector<double>>& X, std::vector<std::vector<double>>& Y) const {
    X.assign(L + 1, {});
    Y.assign(L + 1, {});
    X[0] = Y[0] = E;
    for (int i = 1; i <= L; ++i) {
      X[i] = block(Y[i - 1], W[i]);
      const std::vector<int> s = k::dwa_sources(i, dilation, period);
      if (s.empty()) {
        Y[i] = X[i];
        continue;
      }
      std::vector<const double*> src;
      for (int j : s) src.push_back(X[j].data());
      Y[i].assign(T * d, 0.0);
      k::Dwa<double> dwa{src.data(), static_cast<int>(s.size()), T, d, alpha[i].data()};
      k::dwa_forward(dwa, Y[i].data());
    }
    return Y[L];
  }

  double loss() const {
    std::vector<std::vector<double>> X, Y;
    return weighted_sum(forward(X, Y), G);
  }

  // gE, galpha[i], gW[i].
  void backward(std::vector<double>& gE, std::vector<std::vector<double>>& galpha,
                std::vector<std::vector<double>>& gW) const {
    std::vector<std::vector<double>> X, Y;
    forward(X, Y);
    std::vector<std::vector<double>> gX(L + 1, std::vector<double>(T * d, 0.0));
    galpha.assign(L + 1, {});
    gW.assign(L + 1, std::vector<double>(d * d, 0.0));
    std::vector<double> gY = G;  // the gradient of Y_i, from i = L down
    for (int i = L; i >= 1; --i) {
      const std::vector<int> s = k::dwa_sources(i, dilation, period);
      if (s.empty()) {
        for (int e = 0; e < T * d; ++e) gX[i][e] += gY[e];
      } else {
        std::vector<const double*> src;
        std::vector<double*> dsrc;
        for (int j : s) {
          src.push_back(X[j].data());
          dsrc.push_back(gX[j].data());
        }
        galpha[i].assign(s.size(), 0.0);
        std::vector<double> scratch(k::dwa_scratch_size(T, static_cast<int>(s.size())));
        k::Dwa<double> dwa{src.data(), static_cast<int>(s.size()), T, d, alpha[i].data()};
        k::dwa_backward(dwa, gY.data(), dsrc.data(), galpha[i].data(), scratch.data());
      }
      // Block i's backward with gX_i complete: X = Y + tanh(Y W).
      const std::vector<double>& y = Y[i - 1];
      std::vector<double> gy = gX[i];
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < d; ++c) {
          double u = 0;
          for (int e = 0; e < d; ++e) u += y[t * d + e] * W[i][e * d + c];
          const double gu = gX[i][t * d + c] * (1 - std::tanh(u) * std::tanh(u));
          for (int e = 0; e < d; ++e) {
            gW[i][e * d + c] += y[t * d + e] * gu;
            gy[t * d + e] += gu * W[i][e * d + c];
          }
        }
      gY = gy;
    }
    gE = gY;
    for (int e = 0; e < T * d; ++e) gE[e] += gX[0][e];
  }
};

ToyStack spec_a3(int L, int dilation, int period) {
  ToyStack st;
  st.L = L;
  st.dilation = dilation;
  st.period = period;
  st.E = fill(4, {2, 3});
  st.G = fill(5, {2, 3});
  st.W.assign(L + 1, {});
  st.alpha.assign(L + 1, {});
  for (int i = 1; i <= L; ++i) {
    st.W[i] = fill(9 + i, {3, 3}, 0.5);
    const auto s = k::dwa_sources(i, dilation, period);
    if (!s.empty()) st.alpha[i] = fill(19 + i, {static_cast<std::int64_t>(s.size())}, 0.5);
  }
  return st;
}

}  // namespace

TEST(Dwa, SpecVectorA3Wiring) {
  const ToyStack st = spec_a3(6, 2, 3);
  EXPECT_EQ(st.alpha[3], (std::vector<double>{-0.25, 0.3125}));
  EXPECT_EQ(st.alpha[6], (std::vector<double>{-0.3125, 0.25, 0.5, -0.25}));
  std::vector<std::vector<double>> X, Y;
  const auto Y6 = st.forward(X, Y);
  std::vector<double> gE;
  std::vector<std::vector<double>> galpha, gW;
  st.backward(gE, galpha, gW);
  expect_spec("A3 Y_6", Y6,
              {-0.08937589472, 0.03911611806, 0.003135514519, -0.0220635744, -0.1613059804, -0.02244599335});
  expect_spec("A3 g_E", gE,
              {-0.04976639262, -0.06998857977, -0.09694935768, 0.1896973453, 0.03245002933, 0.1240675883});
  expect_spec("A3 galpha_3", galpha[3], {0.03516212308, 0.08679989646});
  expect_spec("A3 galpha_6", galpha[6], {-0.234375, 0.576533714, 0.0208877912, -0.03104126342});
  expect_spec("A3 checksum(gW_1)", checksum(gW[1]), -0.6409410115);
  expect_spec("A3 checksum(gW_6)", checksum(gW[6]), 0.1155304668);
}

TEST(Dwa, WiringGradientsMatchFiniteDifferences) {
  // The spec's other checked schedules (§6.4): (L, k, p) in {(6,2,3), (4,1,1), (5,2,1), (5,1,2)}.
  for (auto [L, kk, p] : {std::tuple{6, 2, 3}, std::tuple{4, 1, 1}, std::tuple{5, 2, 1}, std::tuple{5, 1, 2}}) {
    ToyStack st = spec_a3(L, kk, p);
    std::vector<double> gE;
    std::vector<std::vector<double>> galpha, gW;
    st.backward(gE, galpha, gW);
    auto loss = [&] { return st.loss(); };
    EXPECT_LT(max_rel_error(gE, numeric_gradient(loss, st.E)), 1e-8) << L << kk << p;
    for (int i = 1; i <= L; ++i) {
      EXPECT_LT(max_rel_error(gW[i], numeric_gradient(loss, st.W[i])), 1e-8) << "W " << i;
      if (!st.alpha[i].empty()) {
        EXPECT_LT(max_rel_error(galpha[i], numeric_gradient(loss, st.alpha[i])), 1e-8) << "alpha " << i;
      }
    }
  }
}

TEST(Dwa, OpGradientsMatchFiniteDifferences) {
  const int S = 4, d = 6;
  const std::int64_t T = 70;  // more than one reduction chunk
  auto X = random_vector<double>(S * T * d, 1), alpha = random_vector<double>(S, 2), up = random_vector<double>(T * d, 3);
  auto src = rows_of(X, S, T * d);
  std::vector<double> Y(T * d);
  auto loss = [&] {
    k::Dwa<double> dwa{src.data(), S, T, d, alpha.data()};
    k::dwa_forward(dwa, Y.data());
    return weighted_sum(Y, up);
  };
  std::vector<double> gX(S * T * d, 0.0), galpha(S, 0.0), scratch(k::dwa_scratch_size(T, S));
  auto dsrc = rows_of(gX, S, T * d);
  k::Dwa<double> dwa{src.data(), S, T, d, alpha.data()};
  k::dwa_backward(dwa, up.data(), dsrc.data(), galpha.data(), scratch.data());
  const double ex = max_rel_error(gX, numeric_gradient(loss, X)), ea = max_rel_error(galpha, numeric_gradient(loss, alpha));
  std::printf("[fd] DWA sources %.2e alpha %.2e\n", ex, ea);
  EXPECT_LT(ex, 1e-8);
  EXPECT_LT(ea, 1e-8);
}

namespace {

template <class Real>
struct DwaResult {
  std::vector<Real> Y, gX, galpha;
};

template <class Real>
DwaResult<Real> run(int S, std::int64_t T, int d) {
  const auto X = converted<Real>(random_vector<double>(S * T * d, 11)), alpha = converted<Real>(random_vector<double>(S, 12));
  const auto up = converted<Real>(random_vector<double>(T * d, 13));
  DwaResult<Real> r{std::vector<Real>(T * d), std::vector<Real>(S * T * d, Real(0)), std::vector<Real>(S, Real(0))};
  auto src = rows_of(X, S, T * d);
  auto dsrc = rows_of(r.gX, S, T * d);
  std::vector<Real> scratch(k::dwa_scratch_size(T, S));
  k::Dwa<Real> dwa{src.data(), S, T, d, alpha.data()};
  k::dwa_forward(dwa, r.Y.data());
  k::dwa_backward(dwa, up.data(), dsrc.data(), r.galpha.data(), scratch.data());
  return r;
}

}  // namespace

TEST(Dwa, FloatMatchesDouble) {
  const int S = 5, d = 37;  // a vector tail
  const auto f = run<float>(S, 300, d);
  const auto g = run<double>(S, 300, d);
  EXPECT_LT(max_rel_error(f.Y, g.Y), 1e-6);
  EXPECT_LT(max_rel_error(f.gX, g.gX), 1e-6);
  EXPECT_LT(max_rel_error(f.galpha, g.galpha), 1e-5);
}

TEST(Dwa, FloatGradientsAreBitIdenticalAcrossThreadCounts) {
  std::vector<DwaResult<float>> r;
  for (int n : {1, 2, 3}) with_threads(n, [&] { r.push_back(run<float>(6, 1000, 64)); });
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(r[i].galpha, r[0].galpha) << "threads " << i + 1;
    EXPECT_EQ(r[i].gX, r[0].gX) << "threads " << i + 1;
    EXPECT_EQ(r[i].Y, r[0].Y) << "threads " << i + 1;
  }
}

TEST(Dwa, IdentityInitIsThePlainStackBitForBit) {
  // alpha = (0, ..., 0, 1): Y equals the block's own output exactly (0 * X_j adds exact zeros).
  const int S = 7, d = 45;
  const std::int64_t T = 90;
  const auto X = converted<float>(random_vector<double>(S * T * d, 21, 3.0));
  std::vector<float> alpha(S, 0.0f);
  alpha.back() = 1.0f;
  auto src = rows_of(X, S, T * d);
  std::vector<float> Y(T * d);
  k::Dwa<float> dwa{src.data(), S, T, d, alpha.data()};
  k::dwa_forward(dwa, Y.data());
  EXPECT_EQ(std::memcmp(Y.data(), X.data() + (S - 1) * T * d, Y.size() * sizeof(float)), 0);
}
