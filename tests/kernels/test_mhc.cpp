// mHC (baselines-spec §4): Sinkhorn-Knopp in both orders (D1, incl. t = 1), one module (D2), the
// 3-sublayer stack wiring (D3), finite differences of every input and parameter, float against
// double, thread-count bit identity and the equal-streams invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/mhc.hpp"
#include "kernels/streams.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

std::vector<double> slice(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::vector<double>(v.begin() + from, v.begin() + from + n);
}

struct Sinkhorn {
  std::vector<double> M, gZ;
};

Sinkhorn sinkhorn(const std::vector<double>& Z, const std::vector<double>& G, int n, int iters, k::SinkhornOrder o) {
  Sinkhorn s{std::vector<double>(n * n), std::vector<double>(n * n)};
  std::vector<double> work(k::sinkhorn_work_size(n, iters));
  k::sinkhorn_forward(s.M.data(), Z.data(), n, iters, o);
  k::sinkhorn_backward(s.gZ.data(), Z.data(), G.data(), n, iters, o, work.data());
  return s;
}

std::vector<double> sums(const std::vector<double>& M, int n, bool rows) {
  std::vector<double> s(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) s[rows ? i : j] += M[i * n + j];
  return s;
}

}  // namespace

TEST(Sinkhorn, SpecVectorD1) {
  const auto Z = fill(50, {4, 4}, 2.0), G = fill(51, {4, 4});
  const auto cr = sinkhorn(Z, G, 4, 20, k::SinkhornOrder::col_row);
  expect_spec("D1 col-row M", cr.M,
              {0.08316333421, 0.541930384, 0.03582262033, 0.3390836614, 0.07804041693, 0.3960568861, 0.1173310996,
               0.4085715974, 0.0393186014, 0.03467533819, 0.7201580599, 0.2058480005, 0.799476033, 0.02733826991,
               0.1266882754, 0.04649742171});
  for (double s : sums(cr.M, 4, true)) EXPECT_NEAR(s, 1.0, 4e-16);  // the last half-step's sums are exact
  expect_spec("D1 col-row column sums", sums(cr.M, 4, false), {0.9999983855, 1.000000878, 1.000000055, 1.000000681});
  expect_spec("D1 col-row gZ", cr.gZ,
              {-0.06317667962, 0.2601943421, 0.0477842883, -0.2448018737, 0.02060042765, -0.2955513376, 0.1006178361,
               0.1743331011, 0.006324642831, 0.01389255148, -0.08682355739, 0.06660637959, 0.03625160913,
               0.02146444402, -0.06157856701, 0.003862393073});
  const auto rc = sinkhorn(Z, G, 4, 20, k::SinkhornOrder::row_col);
  expect_spec("D1 row-col M[0:2]", slice(rc.M, 0, 2), {0.08316377616, 0.5419300319});
  for (double s : sums(rc.M, 4, false)) EXPECT_NEAR(s, 1.0, 4e-16);
  expect_spec("D1 row-col gZ[0:2]", slice(rc.gZ, 0, 2), {-0.06317715233, 0.2601944737});
  // t = 1 pins the order.
  const auto cr1 = sinkhorn(Z, G, 4, 1, k::SinkhornOrder::col_row);
  expect_spec("D1 t=1 col-row M[0:4]", slice(cr1.M, 0, 4), {0.05515413007, 0.5482347614, 0.03425728587, 0.3623538227});
  expect_spec("D1 t=1 col-row gZ[0:4]", slice(cr1.gZ, 0, 4),
              {-0.04587288257, 0.2558557035, 0.04268744668, -0.3177690284});
  const auto rc1 = sinkhorn(Z, G, 4, 1, k::SinkhornOrder::row_col);
  expect_spec("D1 t=1 row-col M[0:4]", slice(rc1.M, 0, 4), {0.07824817458, 0.5071199371, 0.02871679715, 0.3014814013});
}

TEST(Sinkhorn, GradientsMatchFiniteDifferences) {
  for (int n : {2, 4, 5})
    for (int iters : {1, 3, 20})
      for (auto o : {k::SinkhornOrder::col_row, k::SinkhornOrder::row_col}) {
        auto Z = random_vector<double>(n * n, n + iters, 1.5);
        const auto G = random_vector<double>(n * n, 100 + n);
        std::vector<double> M(n * n);
        auto loss = [&] {
          k::sinkhorn_forward(M.data(), Z.data(), n, iters, o);
          return weighted_sum(M, G);
        };
        const auto s = sinkhorn(Z, G, n, iters, o);
        EXPECT_LT(max_rel_error(s.gZ, numeric_gradient(loss, Z)), 1e-7) << n << " " << iters;
      }
}

namespace {

// One mHC module with its sublayer output y given. phi is kept in the kernel's [n(n+2), n d] layout.
template <class Real>
struct MhcCase {
  int n = 3, d = 2, iters = 20;
  std::int64_t T = 2;
  k::SinkhornOrder order = k::SinkhornOrder::col_row;
  Real pre_eps = 0;
  std::vector<Real> x, phi, alpha, bias, y, up_h, up_out;

  k::ManifoldHyperConnection<Real> op() const {
    k::ManifoldHyperConnection<Real> m;
    m.streams = x.data();
    m.n_tok = T;
    m.n = n;
    m.d = d;
    m.eps = Real(1e-6);
    m.phi = phi.data();
    m.alpha = alpha.data();
    m.bias = bias.data();
    m.sinkhorn_iters = iters;
    m.order = order;
    m.pre_eps = pre_eps;
    return m;
  }
};

template <class Real>
struct MhcResult {
  std::vector<Real> h, coef, z, rms, out;          // forward
  std::vector<Real> dx, dy, dpost, dphi, dalpha, dbias;  // backward
};

template <class Real>
MhcResult<Real> forward(const MhcCase<Real>& c) {
  const int m = k::stream_coefficient_count(c.n);
  MhcResult<Real> r;
  r.h.assign(c.T * c.d, Real(0));
  r.coef.assign(c.T * m, Real(0));
  r.z.assign(c.T * m, Real(0));
  r.rms.assign(c.T, Real(0));
  r.out.assign(c.T * c.n * c.d, Real(0));
  const auto op = c.op();
  k::mhc_forward(op, r.h.data(), r.coef.data(), r.z.data(), r.rms.data());
  k::stream_write_forward(r.out.data(), c.x.data(), k::mhc_coefficients(op, r.coef.data()), c.y.data(), c.T, c.n,
                          c.d);
  return r;
}

template <class Real>
MhcResult<Real> run(const MhcCase<Real>& c) {
  MhcResult<Real> r = forward(c);
  const auto op = c.op();
  r.dy.assign(c.T * c.d, Real(0));
  r.dpost.assign(c.T * c.n, Real(0));
  k::stream_write_backward(r.dy.data(), r.dpost.data(), c.up_out.data(), c.y.data(),
                           k::mhc_coefficients(op, r.coef.data()), c.T, c.n, c.d);
  r.dx.assign(c.x.size(), Real(0));
  r.dphi.assign(c.phi.size(), Real(0));
  r.dalpha.assign(3, Real(0));
  r.dbias.assign(c.bias.size(), Real(0));
  std::vector<Real> scratch(k::mhc_scratch_size(c.T, c.n, c.iters));
  k::mhc_backward(op, r.coef.data(), r.z.data(), r.rms.data(), c.up_h.data(), c.up_out.data(), r.dpost.data(),
                  r.dx.data(), {r.dphi.data(), r.dalpha.data(), r.dbias.data()}, scratch.data());
  return r;
}

// H_pre, H_post and H_res of token t from the stored coefficients.
std::vector<double> h_pre(const MhcResult<double>& r, int n, std::int64_t t) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(r.coef[t * n * (n + 2) + i * (n + 1)]);
  return v;
}
std::vector<double> h_post(const MhcResult<double>& r, int n, std::int64_t t) {
  return slice(r.coef, t * n * (n + 2) + n * (n + 1), n);
}
std::vector<double> h_res(const MhcResult<double>& r, int n, std::int64_t t) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) v.push_back(r.coef[t * n * (n + 2) + j * (n + 1) + i + 1]);
  return v;
}

}  // namespace

TEST(Mhc, SpecVectorD2Module) {
  MhcCase<double> c;
  c.x = fill(60, {2, 3, 2});
  c.phi = transposed(fill(61, {6, 15}, 0.5), 6, 15);
  c.alpha = {0.7, -0.4, 1.3};
  c.bias = fill(62, {15}, 0.5);
  c.y = fill(65, {2, 2});
  c.up_h = fill(66, {2, 2});
  c.up_out = fill(64, {2, 3, 2});
  const auto r = run(c);
  auto pre = h_pre(r, 3, 0), pre1 = h_pre(r, 3, 1), post = h_post(r, 3, 0), post1 = h_post(r, 3, 1);
  pre.insert(pre.end(), pre1.begin(), pre1.end());
  post.insert(post.end(), post1.begin(), post1.end());
  expect_spec("D2 H_pre", pre, {0.4116225398, 0.4472948044, 0.5361422617, 0.3188070367, 0.2582777343, 0.5005014466});
  expect_spec("D2 H_post", post, {0.9274998197, 1.327818893, 0.8425288776, 0.7503311547, 1.368850822, 1.101828525});
  expect_spec("D2 H_res[token0]", h_res(r, 3, 0),
              {0.5162954288, 0.1262224749, 0.3574820963, 0.2935474581, 0.4704042185, 0.2360483233, 0.1901571131,
               0.4033733066, 0.4064695804});
  expect_spec("D2 h_in", r.h, {0.5545761714, -0.1806471601, -0.06612865094, 0.506508392});
  expect_spec("D2 x'[token0]", slice(r.out, 0, 6),
              {-0.3034146279, -0.09955107097, -0.7650678023, 0.463629267, -0.3921342114, 0.1603837016});
  expect_spec("D2 g_x[token0]", slice(r.dx, 0, 6),
              {-0.2563183937, 0.4790411348, -0.2057333455, 0.1970261702, -0.1991826632, 0.307432424});
  expect_spec("D2 g_y", r.dy, {-1.472404834, 1.243448149, -0.4043259478, -1.378985291});
  expect_spec("D2 g_alpha", r.dalpha, {-0.1769237229, -0.4041672254, -0.12608953});
  expect_spec("D2 g_b", r.dbias,
              {0.1889600592, -0.03235762583, 0.2180151484, 0.1347899441, 0.2035548644, 0.7298702192, -0.01641887366,
               0.0541500807, -0.03773120704, -0.05787907718, -0.1120458734, 0.1699249506, 0.07429795084,
               0.05789579268, -0.1321937435});
  expect_spec("D2 checksum(gphi)", checksum(transposed(r.dphi, 15, 6)), 0.9514994468);
}

namespace {

// The spec's D3 stack: three sublayers, n = 3, d = 4, toy branches y = tanh(h_in M_l).
struct MhcStack {
  std::vector<MhcCase<double>> layer;
  std::vector<std::vector<double>> M;
  std::vector<double> X0, G;
  int n = 3, d = 4;
  std::int64_t T = 2;

  std::vector<double> run(std::vector<double>* gX0 = nullptr, std::vector<MhcResult<double>>* grads = nullptr) {
    std::vector<std::vector<double>> X{X0};
    std::vector<MhcResult<double>> fw;
    for (std::size_t l = 0; l < layer.size(); ++l) {
      MhcCase<double>& c = layer[l];
      c.x = X.back();
      c.y.assign(T * d, 0.0);
      auto r = forward(c);
      c.y = tanh_branch(r.h, M[l], d);
      r = forward(c);
      X.push_back(r.out);
      fw.push_back(r);
    }
    if (gX0 == nullptr) return X.back();
    std::vector<double> g = G;
    if (grads != nullptr) grads->assign(layer.size(), {});
    for (int l = static_cast<int>(layer.size()) - 1; l >= 0; --l) {
      MhcCase<double>& c = layer[l];
      std::vector<double> dy(T * d), dpost(T * n);
      k::stream_write_backward(dy.data(), dpost.data(), g.data(), c.y.data(),
                               k::mhc_coefficients(c.op(), fw[l].coef.data()), T, n, d);
      const std::vector<double> dh = tanh_branch_backward(dy, c.y, M[l], d);
      MhcResult<double> r = fw[l];
      r.dx.assign(c.x.size(), 0.0);
      r.dphi.assign(c.phi.size(), 0.0);
      r.dalpha.assign(3, 0.0);
      r.dbias.assign(c.bias.size(), 0.0);
      std::vector<double> scratch(k::mhc_scratch_size(T, n, c.iters));
      k::mhc_backward(c.op(), r.coef.data(), r.z.data(), r.rms.data(), dh.data(), g.data(), dpost.data(),
                      r.dx.data(), {r.dphi.data(), r.dalpha.data(), r.dbias.data()}, scratch.data());
      g = r.dx;
      if (grads != nullptr) (*grads)[l] = r;
    }
    *gX0 = g;
    return X.back();
  }
};

MhcStack spec_d3() {
  MhcStack st;
  st.X0 = fill(80, {2, 3, 4});
  st.G = fill(81, {2, 3, 4});
  for (int l = 0; l < 3; ++l) {
    MhcCase<double> c;
    c.n = 3;
    c.d = 4;
    c.phi = transposed(fill(200 + 10 * l, {12, 15}, 0.25), 12, 15);
    c.bias = fill(201 + 10 * l, {15}, 0.5);
    c.alpha = {0.5, 0.6 - 0.2 * l, 1.0 + 0.5 * l};
    st.layer.push_back(c);
    st.M.push_back(fill(205 + 10 * l, {4, 4}, 0.5));
  }
  return st;
}

}  // namespace

TEST(Mhc, SpecVectorD3StackWiring) {
  MhcStack st = spec_d3();
  std::vector<double> gX0;
  std::vector<MhcResult<double>> grads;
  const auto X3 = st.run(&gX0, &grads);
  expect_spec("D3 X_3[token0]", slice(X3, 0, 12),
              {-0.1721188473, -0.9225764338, 0.1640823765, 0.5555178565, -0.2645352364, -1.061007432, 0.3562160144,
               0.4458785529, -0.1970826888, -0.9520306182, 0.1956328477, 0.5408302702});
  expect_spec("D3 g_X0[token0]", slice(gX0, 0, 12),
              {-0.4266536699, 0.1701026537, -0.0106497774, -0.3191983515, -0.5122271896, 0.1760608158,
               -0.04148447446, -0.2668083674, -0.5584135162, 0.1988555902, -0.04577177104, -0.2549356426});
  expect_spec("D3 g_b(l=0)[0:6]", slice(grads[0].dbias, 0, 6),
              {0.006688539982, -0.1188855254, -0.04227278766, -0.05262490152, -0.07647770482, -0.05904861957});
  expect_spec("D3 g_alpha(l=2)", grads[2].dalpha, {0.456388501, -0.06209190524, -0.01087592018});
  expect_spec("D3 checksum(gphi_1)", checksum(transposed(grads[1].dphi, 15, 12)), 0.5658974923);

  // The whole stack against finite differences.
  auto loss = [&] { return weighted_sum(st.run(), st.G); };
  EXPECT_LT(max_rel_error(gX0, numeric_gradient(loss, st.X0)), 1e-8);
  for (int l = 0; l < 3; ++l) {
    EXPECT_LT(max_rel_error(grads[l].dphi, numeric_gradient(loss, st.layer[l].phi)), 1e-7) << l;
    EXPECT_LT(max_rel_error(grads[l].dbias, numeric_gradient(loss, st.layer[l].bias)), 1e-7) << l;
    EXPECT_LT(max_rel_error(grads[l].dalpha, numeric_gradient(loss, st.layer[l].alpha)), 1e-7) << l;
  }
}

namespace {

template <class Real>
MhcCase<Real> random_case(int n, int d, std::int64_t T, int iters, k::SinkhornOrder order, double pre_eps) {
  MhcCase<Real> c;
  c.n = n;
  c.d = d;
  c.T = T;
  c.iters = iters;
  c.order = order;
  c.pre_eps = Real(pre_eps);
  const int m = k::stream_coefficient_count(n);
  c.x = converted<Real>(random_vector<double>(T * n * d, 1));
  c.phi = converted<Real>(random_vector<double>(m * n * d, 2, 0.3));
  c.alpha = converted<Real>(std::vector<double>{0.8, -0.6, 1.1});
  c.bias = converted<Real>(random_vector<double>(m, 3, 0.7));
  c.y = converted<Real>(random_vector<double>(T * d, 4));
  c.up_h = converted<Real>(random_vector<double>(T * d, 5));
  c.up_out = converted<Real>(random_vector<double>(T * n * d, 6));
  return c;
}

}  // namespace

TEST(Mhc, ModuleGradientsMatchFiniteDifferences) {
  for (auto order : {k::SinkhornOrder::col_row, k::SinkhornOrder::row_col})
    for (int iters : {1, 20}) {
      auto c = random_case<double>(3, 5, 70, iters, order, iters == 1 ? 1e-6 : 0.0);
      const auto r = run(c);
      auto loss = [&] {
        const auto f = forward(c);
        return weighted_sum(f.h, c.up_h) + weighted_sum(f.out, c.up_out);
      };
      double worst = 0;
      auto expect = [&](const std::vector<double>& g, std::vector<double>& x, const char* what) {
        const double e = max_rel_error(g, numeric_gradient(loss, x));
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-7) << what << " iters " << iters;
      };
      expect(r.dx, c.x, "streams");
      expect(r.dy, c.y, "y");
      expect(r.dphi, c.phi, "phi");
      expect(r.dalpha, c.alpha, "alpha");
      expect(r.dbias, c.bias, "bias");
      std::printf("[fd] mHC %s t=%-2d max rel err %.2e\n", order == k::SinkhornOrder::col_row ? "col-row" : "row-col",
                  iters, worst);
    }
}

TEST(Mhc, FloatMatchesDouble) {
  const auto f = run(random_case<float>(4, 37, 300, 20, k::SinkhornOrder::col_row, 0.0));
  const auto g = run(random_case<double>(4, 37, 300, 20, k::SinkhornOrder::col_row, 0.0));
  EXPECT_LT(max_rel_error(f.h, g.h), 1e-5);
  EXPECT_LT(max_rel_error(f.out, g.out), 1e-5);
  EXPECT_LT(max_rel_error(f.dx, g.dx), 1e-5);
  EXPECT_LT(max_rel_error(f.dy, g.dy), 1e-5);
  EXPECT_LT(max_rel_error(f.dphi, g.dphi), 1e-5);
  EXPECT_LT(max_rel_error(f.dalpha, g.dalpha), 1e-5);
  EXPECT_LT(max_rel_error(f.dbias, g.dbias), 1e-5);
}

TEST(Mhc, FloatGradientsAreBitIdenticalAcrossThreadCounts) {
  const auto c = random_case<float>(4, 64, 1000, 20, k::SinkhornOrder::col_row, 0.0);
  std::vector<MhcResult<float>> r;
  for (int t : {1, 2, 3}) with_threads(t, [&] { r.push_back(run(c)); });
  for (int i = 1; i < 3; ++i)
    for (auto p : {&MhcResult<float>::h, &MhcResult<float>::out, &MhcResult<float>::dx, &MhcResult<float>::dy,
                   &MhcResult<float>::dphi, &MhcResult<float>::dalpha, &MhcResult<float>::dbias})
      EXPECT_EQ(r[i].*p, r[0].*p) << "threads " << i + 1;
}

TEST(Mhc, ZeroPhiAndPostBiasKeepReplicatedStreamsEqual) {
  // phi = 0, b_post = 0 (home +-3 biases elsewhere): H_post = 1, H_res has unit row sums, so from
  // replicated streams every new stream is x + y up to rounding, and h_in = (sum H_pre) x.
  auto c = random_case<double>(4, 16, 50, 20, k::SinkhornOrder::col_row, 0.0);
  const int n = 4, m = k::stream_coefficient_count(n);
  std::fill(c.phi.begin(), c.phi.end(), 0.0);
  for (int i = 0; i < n; ++i) {
    c.bias[i] = i == 1 ? 3.0 : -3.0;                                    // pre: home stream 1
    c.bias[n + i] = 0.0;                                                // post
    for (int j = 0; j < n; ++j) c.bias[2 * n + i * n + j] = i == j ? 3.0 : -3.0;  // res: 6I - 3
  }
  const auto x = random_vector<double>(c.T * c.d, 70);
  k::stream_expand(c.x.data(), x.data(), c.T, n, c.d);
  const auto r = forward(c);
  const double pre_sum = 1 / (1 + std::exp(-3.0)) + 3 / (1 + std::exp(3.0));
  for (std::int64_t t = 0; t < c.T; ++t) {
    for (int i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(r.coef[t * m + n * (n + 1) + i], 1.0);
    for (int e = 0; e < c.d; ++e) {
      EXPECT_NEAR(r.h[t * c.d + e], pre_sum * x[t * c.d + e], 1e-14);
      for (int i = 0; i < n; ++i)
        EXPECT_NEAR(r.out[(t * n + i) * c.d + e], x[t * c.d + e] + c.y[t * c.d + e], 1e-14);
    }
  }
}

TEST(Mhc, ResidualMixGetsNoGradientFromEqualStreams) {
  // Spec §4.4: with identical input streams g_Hres[i, j] = <g_x'_i, x> is constant along each row,
  // which the last (row) half-step of the col-row order maps to exactly zero, up to rounding.
  auto c = random_case<double>(3, 8, 40, 20, k::SinkhornOrder::col_row, 0.0);
  const auto x = random_vector<double>(c.T * c.d, 71);
  k::stream_expand(c.x.data(), x.data(), c.T, c.n, c.d);
  const auto r = run(c);
  const int n = c.n;
  double res = 0, pre = 0;
  for (int e = 0; e < n * n; ++e) res = std::max(res, std::abs(r.dbias[2 * n + e]));
  for (int i = 0; i < n; ++i) pre = std::max(pre, std::abs(r.dbias[i]));
  EXPECT_LT(res, 1e-12 * pre);
}
