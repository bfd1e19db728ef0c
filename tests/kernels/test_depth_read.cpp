// The depth read against the spec's §6.1 vectors and finite differences (float64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <vector>

#include "common/test_util.hpp"
#include "kernels/depth_read.hpp"
#include "kernels/row_ops.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// One token, sources given row by row.
struct OneTokenRead {
  std::vector<std::vector<double>> v;
  std::vector<double> gamma;
  std::vector<std::vector<double>> queries;  // empty vector = uniform route
  bool average = false;
  double eps = 1e-6;

  std::vector<const double*> src() const {
    std::vector<const double*> p;
    for (const auto& s : v) p.push_back(s.data());
    return p;
  }
};

}  // namespace

TEST(DepthRead, SpecVectorA) {
  std::vector<std::vector<double>> v = {{1, 0, 0, 0}, {0, 1, 0, 0}};
  std::vector<double> w = {2, 0, 0, 0}, gamma = {1, 1, 1, 1}, h(4), rms(2), logits(2), alpha(2);
  std::vector<const double*> src = {v[0].data(), v[1].data()};
  k::DepthRead<double> rd;
  rd.sources = src.data();
  rd.n_sources = 2;
  rd.n_tok = 1;
  rd.d = 4;
  rd.eps = 1e-6;
  rd.gamma = gamma.data();
  rd.queries[0] = w.data();
  double* out[] = {h.data(), nullptr};
  k::depth_read_forward(rd, out, rms.data(), logits.data(), alpha.data());
  EXPECT_NEAR(logits[0], 3.999992, 1e-6);
  EXPECT_NEAR(logits[1], 0.0, 1e-12);
  EXPECT_NEAR(h[0], 0.9820136, 1e-7);
  EXPECT_NEAR(h[1], 0.0179864, 1e-7);
  EXPECT_EQ(h[2], 0.0);
}

TEST(DepthRead, SpecVectorBForwardAndBackward) {
  std::vector<std::vector<double>> v = {{1, -2, 0.5, 3}, {0.2, 0.4, -1, 0}, {-3, 1, 1, 2}};
  std::vector<double> w = {0.5, -0.25, 1, 0.1}, gamma = {1, 2, 0.5, 1.5}, g = {1, 0, -1, 0.5};
  std::vector<const double*> src = {v[0].data(), v[1].data(), v[2].data()};
  k::DepthRead<double> rd;
  rd.sources = src.data();
  rd.n_sources = 3;
  rd.n_tok = 1;
  rd.d = 4;
  rd.eps = 1e-6;
  rd.gamma = gamma.data();
  rd.queries[0] = w.data();
  std::vector<double> h(4), rms(3), logits(3), alpha(3);
  double* out[] = {h.data(), nullptr};
  k::depth_read_forward(rd, out, rms.data(), logits.data(), alpha.data());
  const double r_ref[] = {0.529812868, 1.825738815, 0.516397711};
  const double z_ref[] = {1.165588311, -1.095443289, -0.619677253};
  const double a_ref[] = {0.786166366, 0.081952256, 0.131881378};
  const double h_ref[] = {0.406912683, -1.407670452, 0.443012305, 2.622261854};
  std::vector<double> recomputed(3);
  k::depth_weights(logits.data(), 3, false, recomputed.data());
  EXPECT_EQ(recomputed, alpha) << "the saved weights are depth_weights of the saved logits";
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(rms[s], r_ref[s], 1e-8);
    EXPECT_NEAR(logits[s], z_ref[s], 1e-8);
    EXPECT_NEAR(alpha[s], a_ref[s], 1e-8);
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i], h_ref[i], 1e-8);

  std::vector<std::vector<double>> dv(3, std::vector<double>(4, 0.0));
  std::vector<double> dw(4, 0.0), dgamma(4, 0.0), scratch(k::depth_read_scratch_size(1, 4));
  double* dsrc[] = {dv[0].data(), dv[1].data(), dv[2].data()};
  k::DepthReadGrads<double> gr;
  gr.dout[0] = g.data();
  gr.dsources = dsrc;
  gr.dqueries[0] = dw.data();
  gr.dgamma = dgamma.data();
  k::depth_read_backward(rd, rms.data(), logits.data(), alpha.data(), gr, scratch.data());
  const double dv_ref[3][4] = {{0.890529627, -0.057744158, -0.658493554, 0.298520584},
                               {0.075216396, 0.003367939, -0.081952275, 0.039292162},
                               {0.056184052, 0.122280272, -0.300744596, -0.024313781}};
  const double dw_ref[] = {1.173149911, -1.799127044, -0.064467343, 0.485410803};
  const double dg_ref[] = {0.586574956, 0.224890880, -0.128934687, 0.032360720};
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(dv[s][i], dv_ref[s][i], 1e-8) << "source " << s << " dim " << i;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(dw[i], dw_ref[i], 1e-8);
    EXPECT_NEAR(dgamma[i], dg_ref[i], 1e-8);
  }

  // With w = 0 the read is the plain mean of the sources.
  std::vector<double> zero(4, 0.0);
  rd.queries[0] = zero.data();
  k::depth_read_forward(rd, out, rms.data(), logits.data(), alpha.data());
  const double mean_ref[] = {-0.6, -0.2, 0.1666667, 1.6666667};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i], mean_ref[i], 1e-7);
}

namespace {

// Finite-difference check of a multi-token read in every route configuration.
struct ReadCase {
  int n_sources;
  int n_routes;
  bool uniform_second;
  bool average;
  bool normed_last = false;  // the last output carries an RMSNorm (RD's value route)
};

void check_read_gradients(const ReadCase& c) {
  const int d = 6, n_tok = 70;  // more than one reduction chunk
  std::vector<std::vector<double>> v;
  for (int s = 0; s < c.n_sources; ++s) v.push_back(random_vector<double>(n_tok * d, 10 + s));
  std::vector<double> gamma = random_vector<double>(d, 3, 0.5);
  for (auto& x : gamma) x += 1.0;
  std::vector<std::vector<double>> q = {random_vector<double>(d, 4), random_vector<double>(d, 5)};
  std::vector<double> norm_w = random_vector<double>(d, 6, 0.5);
  for (auto& x : norm_w) x += 1.0;
  const int n_out = c.average ? 1 : c.n_routes;
  std::vector<std::vector<double>> upstream;
  for (int o = 0; o < n_out; ++o) upstream.push_back(random_vector<double>(n_tok * d, 20 + o));

  auto make = [&](std::vector<const double*>& src) {
    src.clear();
    for (auto& s : v) src.push_back(s.data());
    k::DepthRead<double> rd;
    rd.sources = src.data();
    rd.n_sources = c.n_sources;
    rd.n_tok = n_tok;
    rd.d = d;
    rd.eps = 1e-6;
    rd.gamma = gamma.data();
    rd.n_routes = c.n_routes;
    rd.queries[0] = q[0].data();
    rd.queries[1] = c.n_routes > 1 && !c.uniform_second ? q[1].data() : nullptr;
    rd.average = c.average;
    if (c.normed_last) rd.out_norm[n_out - 1] = norm_w.data();
    return rd;
  };
  std::vector<std::vector<double>> out(2, std::vector<double>(n_tok * d));
  std::vector<double> rms(n_tok * c.n_sources), logits(2 * n_tok * c.n_sources), alpha(2 * n_tok * c.n_sources);
  auto loss = [&]() {
    std::vector<const double*> src;
    auto rd = make(src);
    double* outs[] = {out[0].data(), out[1].data()};
    k::depth_read_forward(rd, outs, rms.data(), logits.data(), alpha.data());
    double l = 0;
    for (int o = 0; o < n_out; ++o) l += weighted_sum(out[o], upstream[o]);
    return l;
  };
  loss();
  std::vector<std::vector<double>> dv(c.n_sources, std::vector<double>(n_tok * d, 0.0));
  std::vector<std::vector<double>> dq(2, std::vector<double>(d, 0.0));
  std::vector<double> dgamma(d, 0.0), dnorm(d, 0.0), scratch(k::depth_read_scratch_size(n_tok, d));
  std::vector<double> again(n_tok * d, 0.0);
  {
    std::vector<const double*> src;
    auto rd = make(src);
    std::vector<double*> dsrc;
    for (auto& x : dv) dsrc.push_back(x.data());
    k::DepthReadGrads<double> gr;
    for (int o = 0; o < n_out; ++o) gr.dout[o] = upstream[o].data();
    gr.dsources = dsrc.data();
    gr.dqueries[0] = dq[0].data();
    gr.dqueries[1] = dq[1].data();
    gr.dgamma = dgamma.data();
    gr.dout_norm[n_out - 1] = dnorm.data();
    gr.out[n_out - 1] = again.data();
    k::depth_read_backward(rd, rms.data(), logits.data(), alpha.data(), gr, scratch.data());
  }
  if (c.normed_last) {
    EXPECT_EQ(again, out[n_out - 1]) << "the backward's recomputed output differs from the forward's";
    EXPECT_LT(max_rel_error(dnorm, numeric_gradient(loss, norm_w)), 1e-7) << "output norm weight";
  } else {
    for (double x : dnorm) EXPECT_EQ(x, 0.0);
  }
  for (int s = 0; s < c.n_sources; ++s)
    EXPECT_LT(max_rel_error(dv[s], numeric_gradient(loss, v[s])), 1e-7) << "source " << s;
  EXPECT_LT(max_rel_error(dgamma, numeric_gradient(loss, gamma)), 1e-7) << "gamma";
  if (c.n_sources > 1) {
    EXPECT_LT(max_rel_error(dq[0], numeric_gradient(loss, q[0])), 1e-7) << "query";
    if (c.n_routes > 1 && !c.uniform_second) {
      EXPECT_LT(max_rel_error(dq[1], numeric_gradient(loss, q[1])), 1e-7) << "value query";
    }
  } else {
    for (double x : dq[0]) EXPECT_EQ(x, 0.0);  // a single source gives its query no gradient
  }
  if (c.uniform_second) {
    for (double x : dq[1]) EXPECT_EQ(x, 0.0);
  }
}

}  // namespace

TEST(DepthRead, GradientOneRoute) { check_read_gradients({4, 1, false, false}); }
TEST(DepthRead, GradientSingleSource) { check_read_gradients({1, 1, false, false}); }
TEST(DepthRead, GradientTwoRoutes) { check_read_gradients({3, 2, false, false}); }
TEST(DepthRead, GradientAveragedRoutes) { check_read_gradients({3, 2, false, true}); }
TEST(DepthRead, GradientUniformValueRoute) { check_read_gradients({5, 2, true, false}); }
TEST(DepthRead, GradientNormalisedValueRoute) { check_read_gradients({3, 2, false, false, true}); }
TEST(DepthRead, GradientNormalisedUniformValueRoute) { check_read_gradients({4, 2, true, false, true}); }
TEST(DepthRead, GradientNormalisedSingleRoute) { check_read_gradients({4, 1, false, false, true}); }
TEST(DepthRead, GradientNormalisedAveragedRoutes) { check_read_gradients({3, 2, false, true, true}); }

TEST(DepthRead, NoInverseSqrtDScale) {
  // Pitfall from the spec: a 1/sqrt(d) logit scale gives alpha_0 ~ 0.881 on vector A.
  std::vector<double> v0 = {1, 0, 0, 0}, v1 = {0, 1, 0, 0}, w = {2, 0, 0, 0}, gamma = {1, 1, 1, 1};
  std::vector<const double*> src = {v0.data(), v1.data()};
  k::DepthRead<double> rd;
  rd.sources = src.data();
  rd.n_sources = 2;
  rd.n_tok = 1;
  rd.d = 4;
  rd.eps = 1e-6;
  rd.gamma = gamma.data();
  rd.queries[0] = w.data();
  std::vector<double> h(4), rms(2), logits(2), alpha(2);
  double* out[] = {h.data(), nullptr};
  k::depth_read_forward(rd, out, rms.data(), logits.data(), alpha.data());
  EXPECT_GT(alpha[0], 0.98);
}

TEST(DepthRead, RecomputedNormalisedOutputEqualsTheForwardBitForBit) {
  // The RD backward recomputes the value route's normalised input (for Wv's gradient); it must
  // equal the forward's exactly (float: the production type), for a learned and a uniform route,
  // at a width with a vector tail.
  const int n = 5, d = 37;
  const std::int64_t tok = 70;
  std::vector<std::vector<float>> v;
  for (int s = 0; s < n; ++s) {
    const auto r = random_vector<double>(tok * d, 10 + s, 2.0);
    v.emplace_back(r.begin(), r.end());
  }
  const auto to_f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const auto q0 = to_f(random_vector<double>(d, 1)), q1 = to_f(random_vector<double>(d, 2)),
             gamma = to_f(random_vector<double>(d, 3)), norm_w = to_f(random_vector<double>(d, 4)),
             g0 = to_f(random_vector<double>(tok * d, 5)), g1 = to_f(random_vector<double>(tok * d, 6));
  std::vector<const float*> src;
  for (const auto& x : v) src.push_back(x.data());
  for (bool uniform : {false, true}) {
    k::DepthRead<float> rd;
    rd.sources = src.data();
    rd.n_sources = n;
    rd.n_tok = tok;
    rd.d = d;
    rd.eps = 1e-6f;
    rd.gamma = gamma.data();
    rd.n_routes = 2;
    rd.queries[0] = q0.data();
    rd.queries[1] = uniform ? nullptr : q1.data();
    rd.out_norm[1] = norm_w.data();
    std::vector<float> h0(tok * d), xv(tok * d), rms(tok * n), logits(2 * tok * n), alpha(2 * tok * n);
    std::vector<float> again(tok * d, -1.0f);
    float* out[] = {h0.data(), xv.data()};
    k::depth_read_forward(rd, out, rms.data(), logits.data(), alpha.data());
    // Twice: into a buffer of its own, and into dout[1]'s buffer (as the model does), which must
    // change nothing else.
    std::vector<std::vector<float>> grads[2];
    for (int aliased = 0; aliased < 2; ++aliased) {
      std::vector<std::vector<float>> dv(n, std::vector<float>(tok * d, 0.0f));
      std::vector<float*> dsrc;
      for (auto& x : dv) dsrc.push_back(x.data());
      std::vector<float> dq0(d), dq1(d), dgamma(d), dnorm(d), scratch(k::depth_read_scratch_size(tok, d));
      std::vector<float> dxv = g1;
      k::DepthReadGrads<float> gr;
      gr.dout[0] = g0.data();
      gr.dout[1] = dxv.data();
      gr.dsources = dsrc.data();
      gr.dqueries[0] = dq0.data();
      gr.dqueries[1] = dq1.data();
      gr.dgamma = dgamma.data();
      gr.dout_norm[1] = dnorm.data();
      gr.out[1] = aliased ? dxv.data() : again.data();
      k::depth_read_backward(rd, rms.data(), logits.data(), alpha.data(), gr, scratch.data());
      if (aliased) again = dxv;
      EXPECT_EQ(std::memcmp(again.data(), xv.data(), xv.size() * sizeof(float)), 0)
          << "uniform=" << uniform << " aliased=" << aliased;
      grads[aliased] = dv;
      for (auto* x : {&dq0, &dq1, &dgamma, &dnorm}) grads[aliased].push_back(*x);
    }
    EXPECT_EQ(grads[0], grads[1]) << "uniform=" << uniform;
  }
}

TEST(DepthRead, RmsScalesGiveRmsScalesBitsOneAtATime) {
  // The forward takes the sources' RMS factors 8 at a time (row_ops.hpp); each must be the bits
  // of rms_scale on its own sum, for every count (tails of 1-7) and for sums from 0 to large, so
  // that Fp32Golden's hashes do not depend on how the sums are grouped.
  const auto base = random_vector<double>(23, 7, 3.0);
  for (const float eps : {1e-6f, 1e-5f, 0.0f})
    for (const int d : {64, 37, 1})
      for (int n = 1; n <= 23; ++n) {
        std::vector<float> sums(static_cast<std::size_t>(n) + 1, -7.0f);  // one guard past the end
        for (int i = 1; i < n; ++i) {
          const double x = base[static_cast<std::size_t>(i)];
          sums[static_cast<std::size_t>(i)] = static_cast<float>(x * x * std::pow(10.0, i % 9 - 3));
        }
        sums[0] = 0.0f;
        std::vector<float> one_at_a_time(sums);
        for (int i = 0; i < n; ++i)
          one_at_a_time[static_cast<std::size_t>(i)] = k::rms_scale(sums[static_cast<std::size_t>(i)], d, eps);
        k::rms_scales(sums.data(), n, d, eps);
        EXPECT_EQ(std::memcmp(sums.data(), one_at_a_time.data(), sums.size() * sizeof(float)), 0)
            << "n=" << n << " d=" << d << " eps=" << eps;
        EXPECT_EQ(sums[static_cast<std::size_t>(n)], -7.0f) << "wrote past the end, n=" << n;
      }
}
