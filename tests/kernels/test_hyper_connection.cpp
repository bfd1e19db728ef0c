// Hyper-connections (baselines-spec §3) and the shared stream helpers: the spec's vectors C1,
// C1' and C2, finite differences of every input and parameter (static, dynamic with and without
// tanh), float against double, thread-count bit identity and the init invariant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/hyper_connection.hpp"
#include "kernels/streams.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// One HC module with its sublayer output y given: the read (h0), the write (the new streams)
// and both backwards. W_alpha is kept in the kernel's [n+1, d] layout.
template <class Real>
struct HcCase {
  int n = 3, d = 4;
  std::int64_t T = 2;
  bool dynamic = true, tanh = true;
  std::vector<Real> H, A, B, Wa, wb, sa, sb, gamma, y;
  std::vector<Real> up_h0, up_out;  // upstream gradients of h0 and of the new streams

  k::HyperConnection<Real> op() const {
    k::HyperConnection<Real> hc;
    hc.streams = H.data();
    hc.n_tok = T;
    hc.n = n;
    hc.d = d;
    hc.eps = Real(1e-6);
    hc.A = A.data();
    hc.B = B.data();
    if (dynamic) {
      hc.w_alpha = Wa.data();
      hc.w_beta = wb.data();
      hc.s_alpha = sa.data();
      hc.s_beta = sb.data();
      hc.norm = gamma.data();
      hc.tanh = tanh;
    }
    return hc;
  }
};

template <class Real>
struct HcResult {
  std::vector<Real> h0, coef, act, rms, out;                 // forward
  std::vector<Real> dH, dy, dbeta, dA, dB, dWa, dwb, dsa, dsb, dgamma;  // backward
};

template <class Real>
HcResult<Real> forward(const HcCase<Real>& c) {
  const int m = k::stream_coefficient_count(c.n);
  HcResult<Real> r;
  r.h0.assign(c.T * c.d, Real(0));
  r.coef.assign(c.T * m, Real(0));
  r.act.assign(c.T * m, Real(0));
  r.rms.assign(c.T * c.n, Real(0));
  r.out.assign(c.T * c.n * c.d, Real(0));
  std::vector<Real> scratch(k::hc_scratch_size(c.T, c.n, c.d));
  const auto hc = c.op();
  k::hc_forward(hc, r.h0.data(), r.coef.data(), r.act.data(), r.rms.data(), scratch.data());
  k::stream_write_forward(r.out.data(), c.H.data(), k::hc_coefficients(hc, r.coef.data()), c.y.data(), c.T, c.n, c.d);
  return r;
}

template <class Real>
HcResult<Real> run(const HcCase<Real>& c) {
  HcResult<Real> r = forward(c);
  const auto hc = c.op();
  const auto cv = k::hc_coefficients(hc, r.coef.data());
  r.dy.assign(c.T * c.d, Real(0));
  r.dbeta.assign(c.T * c.n, Real(0));
  k::stream_write_backward(r.dy.data(), r.dbeta.data(), c.up_out.data(), c.y.data(), cv, c.T, c.n, c.d);
  r.dH.assign(c.H.size(), Real(0));
  r.dA.assign(c.A.size(), Real(0));
  r.dB.assign(c.B.size(), Real(0));
  r.dWa.assign(c.Wa.size(), Real(0));
  r.dwb.assign(c.wb.size(), Real(0));
  r.dsa.assign(1, Real(0));
  r.dsb.assign(1, Real(0));
  r.dgamma.assign(c.gamma.size(), Real(0));
  k::HyperConnectionGrads<Real> g{r.dA.data(), r.dB.data(), r.dWa.data(), r.dwb.data(), r.dsa.data(), r.dsb.data(),
                                  r.dgamma.data()};
  std::vector<Real> scratch(k::hc_scratch_size(c.T, c.n, c.d));
  k::hc_backward(hc, r.coef.data(), r.act.data(), r.rms.data(), c.up_h0.data(), c.up_out.data(), r.dbeta.data(),
                 r.dH.data(), g, scratch.data());
  return r;
}

// The spec's C1 inputs (n = 3, d = 4, T = 2). g_beta is given there as an upstream of its own,
// so dbeta is overwritten with it before the read backward.
HcCase<double> spec_c1(bool dynamic) {
  HcCase<double> c;
  c.dynamic = dynamic;
  c.H = fill(40, {2, 3, 4});
  c.A = fill(41, {3, 4}, 0.5);
  c.B = one_plus_fill(42, {3}, 0.25);
  c.Wa = transposed(fill(43, {4, 4}, 0.5), 4, 4);
  c.wb = fill(44, {4}, 0.5);
  c.sa = {0.3};
  c.sb = {-0.2};
  c.gamma = one_plus_fill(45, {4}, 0.25);
  c.y.assign(2 * 4, 0.0);  // y = 0: the write gives H' itself
  c.up_h0 = fill(48, {2, 4});
  c.up_out = fill(49, {2, 3, 4});
  return c;
}

HcResult<double> run_with_dbeta(const HcCase<double>& c, const std::vector<double>& dbeta) {
  HcResult<double> r = forward(c);
  const auto hc = c.op();
  r.dbeta = dbeta;
  r.dH.assign(c.H.size(), 0.0);
  r.dA.assign(c.A.size(), 0.0);
  r.dB.assign(c.B.size(), 0.0);
  r.dWa.assign(c.Wa.size(), 0.0);
  r.dwb.assign(c.wb.size(), 0.0);
  r.dsa.assign(1, 0.0);
  r.dsb.assign(1, 0.0);
  r.dgamma.assign(c.gamma.size(), 0.0);
  k::HyperConnectionGrads<double> g{r.dA.data(), r.dB.data(), r.dWa.data(), r.dwb.data(), r.dsa.data(), r.dsb.data(),
                                    r.dgamma.data()};
  std::vector<double> scratch(k::hc_scratch_size(c.T, c.n, c.d));
  k::hc_backward(hc, r.coef.data(), r.act.data(), r.rms.data(), c.up_h0.data(), c.up_out.data(), r.dbeta.data(),
                 r.dH.data(), g, scratch.data());
  return r;
}

std::vector<double> slice(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::vector<double>(v.begin() + from, v.begin() + from + n);
}

}  // namespace

TEST(HyperConnection, SpecVectorC1Dynamic) {
  const auto c = spec_c1(true);
  const auto r = run_with_dbeta(c, fill(47, {2, 3}));
  expect_spec("C1 alpha[token0]", slice(r.coef, 0, 12),
              {0.1677261041, -0.3271209946, -0.04073875282, 0.2783365997, -0.1591523972, 0.5381694783,
               -0.1272745506, -0.02106562629, -0.1303834656, -0.2592563165, 0.737977391, 0.03155873234});
  expect_spec("C1 beta", {r.coef[12], r.coef[13], r.coef[14], r.coef[15 + 12], r.coef[15 + 13], r.coef[15 + 14]},
              {0.8417776637, 1.03231341, 1.301404935, 0.8540347778, 1.255215441, 1.235769171});
  expect_spec("C1 h0", r.h0,
              {0.03818439258, 0.03320680204, 0.03221489008, -0.01323381011, -0.1307288995, -0.0782593047,
               0.0561103873, -0.07039021884});
  expect_spec("C1 checksum(H')", checksum(r.out), 0.3735944593);
  expect_spec("C1 g_H[token0]", slice(r.dH, 0, 12),
              {-0.5017748256, -0.07940264969, -0.09900490005, -0.1340839795, 0.203146635, -0.5278503079,
               -0.005329548636, 0.3435535774, -0.09072468203, 0.6575204868, -0.112334476, 0.268517863});
  expect_spec("C1 g_A", r.dA,
              {-2.25, 0.5, 0.984375, -1.03125, -0.296875, 0.796875, 0.03125, -0.078125, -0.5, -0.640625, 1.296875,
               0.4375});
  expect_spec("C1 g_B", r.dB, {-0.125, 0.375, -0.25});
  expect_spec("C1 g_s_alpha", r.dsa[0], 4.067818101);
  expect_spec("C1 g_s_beta", r.dsb[0], 1.056446722);
  expect_spec("C1 g_w_beta", r.dwb, {-0.01554097997, 0.4338517896, -0.1824280042, 0.01282438942});
  expect_spec("C1 g_gamma", r.dgamma, {-0.1570714261, 0.08775852576, 0.3854490816, 0.2443710593});
  expect_spec("C1 checksum(gW_alpha)", checksum(transposed(r.dWa, 4, 4)), 2.438397893);
}

TEST(HyperConnection, SpecVectorC1Static) {
  const auto c = spec_c1(false);
  const auto r = run_with_dbeta(c, fill(47, {2, 3}));
  expect_spec("C1' h0", r.h0, {-0.0859375, 0.0390625, 0, -0.171875, -0.28125, -0.1953125, 0.1015625, -0.15625});
  expect_spec("C1' checksum(H')", checksum(r.out), 0.416015625);
  expect_spec("C1' g_H[token0]", slice(r.dH, 0, 12),
              {-0.2734375, 0.0625, -0.0703125, -0.3359375, 0.3203125, -0.3359375, -0.109375, 0.2890625, 0.1015625,
               0.5078125, -0.03125, 0.171875});
  expect_spec("C1' g_A", r.dA,
              {-2.25, 0.5, 0.984375, -1.03125, -0.296875, 0.796875, 0.03125, -0.078125, -0.5, -0.640625, 1.296875,
               0.4375});
  expect_spec("C1' g_B", r.dB, {-0.125, 0.375, -0.25});
}

namespace {

// The spec's C2 stack: three sublayers with toy branches y = tanh(h0 M_l) on distinct streams,
// loss sum G * X_3; the backward runs the write backward, the toy branch's, then the read's.
struct HcStack {
  bool dynamic = true;
  std::vector<HcCase<double>> layer;
  std::vector<std::vector<double>> M;
  std::vector<double> X0, G;
  int n = 3, d = 4;
  std::int64_t T = 2;

  // X_3; with gX0 set, also runs the backward and fills every layer's gradients.
  std::vector<double> run(std::vector<double>* gX0 = nullptr, std::vector<HcResult<double>>* grads = nullptr) {
    std::vector<std::vector<double>> X{X0};
    std::vector<HcResult<double>> fw;
    for (std::size_t l = 0; l < layer.size(); ++l) {
      HcCase<double>& c = layer[l];
      c.H = X.back();
      c.y.assign(T * d, 0.0);
      auto r = forward(c);  // h0 first (y does not matter for it), then the write with the branch
      c.y = tanh_branch(r.h0, M[l], d);
      r = forward(c);
      X.push_back(r.out);
      fw.push_back(r);
    }
    if (gX0 == nullptr) return X.back();
    std::vector<double> g = G;
    if (grads != nullptr) grads->assign(layer.size(), {});
    for (int l = static_cast<int>(layer.size()) - 1; l >= 0; --l) {
      HcCase<double>& c = layer[l];
      const auto cv = k::hc_coefficients(c.op(), fw[l].coef.data());
      std::vector<double> dy(T * d), dbeta(T * n);
      k::stream_write_backward(dy.data(), dbeta.data(), g.data(), c.y.data(), cv, T, n, d);
      const std::vector<double> dh0 = tanh_branch_backward(dy, c.y, M[l], d);
      c.up_h0 = dh0;
      c.up_out = g;
      auto r = run_with_dbeta(c, dbeta);
      g = r.dH;
      if (grads != nullptr) (*grads)[l] = r;
    }
    *gX0 = g;
    return X.back();
  }
};

HcStack spec_c2(bool dynamic) {
  HcStack st;
  st.dynamic = dynamic;
  st.X0 = fill(80, {2, 3, 4});
  st.G = fill(81, {2, 3, 4});
  for (int l = 0; l < 3; ++l) {
    const int s = 100 + 10 * l;
    HcCase<double> c;
    c.dynamic = dynamic;
    c.A = fill(s, {3, 4}, 0.5);
    c.B = one_plus_fill(s + 1, {3}, 0.25);
    c.Wa = transposed(fill(s + 2, {4, 4}, 0.5), 4, 4);
    c.wb = fill(s + 3, {4}, 0.5);
    c.gamma = one_plus_fill(s + 4, {4}, 0.25);
    c.sa = {0.2 + 0.1 * l};
    c.sb = {-0.1 * (l + 1)};
    st.layer.push_back(c);
    st.M.push_back(fill(s + 5, {4, 4}, 0.5));
  }
  return st;
}

}  // namespace

TEST(HyperConnection, SpecVectorC2StackWiring) {
  {
    HcStack st = spec_c2(true);
    std::vector<double> gX0;
    std::vector<HcResult<double>> grads;
    const auto X3 = st.run(&gX0, &grads);
    expect_spec("C2 dynamic X_3[token0]", slice(X3, 0, 12),
                {0.1801243169, -0.393710752, 0.06219637794, 0.2650394324, 0.01093718106, 0.04102429229,
                 0.0540889549, -0.04223753835, -0.1178867045, 0.1550799629, -0.02229216347, -0.1043364767});
    expect_spec("C2 dynamic g_X0[token0]", slice(gX0, 0, 12),
                {-0.1872619106, -0.02208496916, -0.006405564843, 0.2594702323, 0.5037031991, 0.5495001595,
                 -0.5133966968, -0.2373445895, 0.1899743308, 0.2477601274, 0.04196507017, 0.3209292007});
    expect_spec("C2 dynamic g_B(l=2)", grads[2].dB, {-0.1584829071, -0.1456886665, -0.0345590668});
  }
  HcStack st = spec_c2(false);
  std::vector<double> gX0;
  const auto X3 = st.run(&gX0);
  expect_spec("C2 static X_3[token0][0:4]", slice(X3, 0, 4),
              {0.03859962041, -0.0673463275, -0.03862143692, 0.0809101568});
  expect_spec("C2 static g_X0[token0][0:4]", slice(gX0, 0, 4),
              {-0.1251731123, -0.005294917091, -0.03718329273, 0.03311637475});
}

TEST(HyperConnection, StackGradientsMatchFiniteDifferences) {
  for (bool dynamic : {true, false}) {
    HcStack st = spec_c2(dynamic);
    std::vector<double> gX0;
    std::vector<HcResult<double>> grads;
    st.run(&gX0, &grads);
    auto loss = [&] { return weighted_sum(st.run(), st.G); };
    EXPECT_LT(max_rel_error(gX0, numeric_gradient(loss, st.X0)), 1e-8) << dynamic;
    for (int l = 0; l < 3; ++l) {
      EXPECT_LT(max_rel_error(grads[l].dA, numeric_gradient(loss, st.layer[l].A)), 1e-8) << l;
      EXPECT_LT(max_rel_error(grads[l].dB, numeric_gradient(loss, st.layer[l].B)), 1e-8) << l;
      if (dynamic) {
        EXPECT_LT(max_rel_error(grads[l].dWa, numeric_gradient(loss, st.layer[l].Wa)), 1e-8) << l;
      }
    }
  }
}

namespace {

HcCase<double> random_case(bool dynamic, bool tanh, int n = 3, int d = 6, std::int64_t T = 70) {
  HcCase<double> c;
  c.n = n;
  c.d = d;
  c.T = T;  // more than one reduction chunk
  c.dynamic = dynamic;
  c.tanh = tanh;
  c.H = random_vector<double>(T * n * d, 1);
  c.A = random_vector<double>(n * (n + 1), 2, 0.5);
  c.B = random_vector<double>(n, 3, 0.5);
  c.Wa = random_vector<double>((n + 1) * d, 4, 0.5);
  c.wb = random_vector<double>(d, 5, 0.5);
  c.sa = {0.7};
  c.sb = {-0.4};
  c.gamma = one_plus_fill(6, {d}, 0.25);
  c.y = random_vector<double>(T * d, 7);
  c.up_h0 = random_vector<double>(T * d, 8);
  c.up_out = random_vector<double>(T * n * d, 9);
  return c;
}

HcCase<float> to_float(const HcCase<double>& c) {
  HcCase<float> f;
  f.n = c.n;
  f.d = c.d;
  f.T = c.T;
  f.dynamic = c.dynamic;
  f.tanh = c.tanh;
  for (auto [to, from] : {std::pair{&f.H, &c.H}, std::pair{&f.A, &c.A}, std::pair{&f.B, &c.B}, std::pair{&f.Wa, &c.Wa},
                          std::pair{&f.wb, &c.wb}, std::pair{&f.sa, &c.sa}, std::pair{&f.sb, &c.sb},
                          std::pair{&f.gamma, &c.gamma}, std::pair{&f.y, &c.y}, std::pair{&f.up_h0, &c.up_h0},
                          std::pair{&f.up_out, &c.up_out}})
    *to = converted<float>(*from);
  return f;
}

}  // namespace

TEST(HyperConnection, ModuleGradientsMatchFiniteDifferences) {
  struct Variant {
    bool dynamic, tanh;
    const char* name;
  };
  for (const Variant v : {Variant{true, true, "dynamic"}, Variant{true, false, "dynamic, no tanh"},
                          Variant{false, true, "static"}}) {
    HcCase<double> c = random_case(v.dynamic, v.tanh);
    const auto r = run(c);
    auto loss = [&] {
      const auto f = forward(c);
      return weighted_sum(f.h0, c.up_h0) + weighted_sum(f.out, c.up_out);
    };
    double worst = 0;
    auto expect = [&](const std::vector<double>& g, std::vector<double>& x, const char* what) {
      const double e = max_rel_error(g, numeric_gradient(loss, x));
      worst = std::max(worst, e);
      EXPECT_LT(e, 1e-7) << v.name << ": " << what;
    };
    expect(r.dH, c.H, "streams");
    expect(r.dy, c.y, "y");
    expect(r.dA, c.A, "A");
    expect(r.dB, c.B, "B");
    if (v.dynamic) {
      expect(r.dWa, c.Wa, "W_alpha");
      expect(r.dwb, c.wb, "w_beta");
      expect(r.dsa, c.sa, "s_alpha");
      expect(r.dsb, c.sb, "s_beta");
      expect(r.dgamma, c.gamma, "gamma");
    }
    std::printf("[fd] HC %-20s max rel err %.2e\n", v.name, worst);
  }
}

TEST(HyperConnection, FloatMatchesDouble) {
  for (bool dynamic : {true, false}) {
    const HcCase<double> cd = random_case(dynamic, true, 4, 37, 300);
    const HcCase<float> cf = to_float(cd);
    const auto f = run(cf);
    const auto g = run(cd);
    EXPECT_LT(max_rel_error(f.h0, g.h0), 1e-5);
    EXPECT_LT(max_rel_error(f.out, g.out), 1e-5);
    EXPECT_LT(max_rel_error(f.dH, g.dH), 1e-5);
    EXPECT_LT(max_rel_error(f.dy, g.dy), 1e-5);
    EXPECT_LT(max_rel_error(f.dA, g.dA), 1e-5);
    EXPECT_LT(max_rel_error(f.dB, g.dB), 1e-5);
    if (dynamic) {
      EXPECT_LT(max_rel_error(f.dWa, g.dWa), 1e-5);
      EXPECT_LT(max_rel_error(f.dwb, g.dwb), 1e-5);
      EXPECT_LT(max_rel_error(f.dsa, g.dsa), 1e-5);
      EXPECT_LT(max_rel_error(f.dsb, g.dsb), 1e-5);
      EXPECT_LT(max_rel_error(f.dgamma, g.dgamma), 1e-5);
    }
  }
}

TEST(HyperConnection, FloatGradientsAreBitIdenticalAcrossThreadCounts) {
  for (bool dynamic : {true, false}) {
    const HcCase<double> cd = random_case(dynamic, true, 4, 64, 1000);
    const HcCase<float> cf = to_float(cd);
    std::vector<HcResult<float>> r;
    for (int t : {1, 2, 3}) with_threads(t, [&] { r.push_back(run(cf)); });
    for (int i = 1; i < 3; ++i)
      for (auto p : {&HcResult<float>::h0, &HcResult<float>::out, &HcResult<float>::dH, &HcResult<float>::dy,
                     &HcResult<float>::dA, &HcResult<float>::dB, &HcResult<float>::dWa, &HcResult<float>::dwb,
                     &HcResult<float>::dsa, &HcResult<float>::dsb, &HcResult<float>::dgamma})
        EXPECT_EQ(r[i].*p, r[0].*p) << "threads " << i + 1 << " dynamic " << dynamic;
  }
}

TEST(HyperConnection, InitReadsTheHomeStreamAndKeepsTheStreams) {
  // A_m = e_{k mod n}, A_r = I, B = 1, W = 0, s = 0.01: h0 = H_{k mod n}, every new stream is
  // H_k + y exactly, and with replicated streams each one equals pre-norm's x + y bit for bit.
  const int n = 4, d = 45;
  const std::int64_t T = 100;
  for (int j : {0, 1, 6}) {
    HcCase<float> c;
    c.n = n;
    c.d = d;
    c.T = T;
    c.H = converted<float>(random_vector<double>(T * n * d, 1 + j));
    c.A.assign(n * (n + 1), 0.0f);
    for (int i = 0; i < n; ++i) c.A[i * (n + 1) + 1 + i] = 1.0f;
    c.A[(j % n) * (n + 1)] = 1.0f;
    c.B.assign(n, 1.0f);
    c.Wa.assign((n + 1) * d, 0.0f);
    c.wb.assign(d, 0.0f);
    c.sa = {0.01f};
    c.sb = {0.01f};
    c.gamma.assign(d, 1.0f);
    c.y = converted<float>(random_vector<double>(T * d, 50));
    const auto r = forward(c);
    for (std::int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(std::memcmp(r.h0.data() + t * d, c.H.data() + (t * n + j % n) * d, d * sizeof(float)), 0) << j;
      for (int i = 0; i < n; ++i)
        for (int e = 0; e < d; ++e)
          ASSERT_EQ(r.out[(t * n + i) * d + e], c.H[(t * n + i) * d + e] + c.y[t * d + e]) << j;
    }
    // Replicated entry: every stream is x + y, as pre-norm computes it.
    std::vector<float> x = converted<float>(random_vector<double>(T * d, 60));
    k::stream_expand(c.H.data(), x.data(), T, n, d);
    const auto e = forward(c);
    for (std::int64_t t = 0; t < T; ++t)
      for (int i = 0; i < n; ++i)
        for (int q = 0; q < d; ++q) ASSERT_EQ(e.out[(t * n + i) * d + q], x[t * d + q] + c.y[t * d + q]);
  }
}

TEST(Streams, ExpandAndReduceAreEachOthersBackward) {
  const int n = 3, d = 5;
  const std::int64_t T = 70;
  auto x = random_vector<double>(T * d, 1), H = random_vector<double>(T * n * d, 2);
  auto up_x = random_vector<double>(T * d, 3), up_H = random_vector<double>(T * n * d, 4);
  for (double scale : {1.0, 1.0 / 3}) {
    std::vector<double> streams(T * n * d), sum(T * d);
    auto loss_expand = [&] {
      k::stream_expand(streams.data(), x.data(), T, n, d, scale);
      return weighted_sum(streams, up_H);
    };
    auto loss_reduce = [&] {
      k::stream_reduce(sum.data(), H.data(), T, n, d, scale);
      return weighted_sum(sum, up_x);
    };
    std::vector<double> gx(T * d), gH(T * n * d);
    k::stream_reduce(gx.data(), up_H.data(), T, n, d, scale);   // expand's backward
    k::stream_expand(gH.data(), up_x.data(), T, n, d, scale);   // reduce's backward
    EXPECT_LT(max_rel_error(gx, numeric_gradient(loss_expand, x)), 1e-8);
    EXPECT_LT(max_rel_error(gH, numeric_gradient(loss_reduce, H)), 1e-8);
  }
  // Sum readout of replicated streams is n x.
  std::vector<double> streams(T * n * d), sum(T * d);
  k::stream_expand(streams.data(), x.data(), T, n, d);
  k::stream_reduce(sum.data(), streams.data(), T, n, d);
  for (std::int64_t i = 0; i < T * d; ++i) EXPECT_DOUBLE_EQ(sum[i], n * x[i]);
}
