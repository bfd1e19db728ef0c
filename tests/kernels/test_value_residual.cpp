// ResFormer's value residual (baselines-spec §5): the spec's vector E, finite differences in every
// lambda parameterisation, float against double, thread-count bit identity, the (0, 1) invariant.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/value_residual.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

template <class Real>
struct VrResult {
  std::vector<Real> out, dvn, dv1, dlambda;
};

template <class Real>
VrResult<Real> run(const std::vector<Real>& v1, const std::vector<Real>& vn, const std::vector<Real>& g,
                   std::int64_t T, int d, Real l1, Real l2) {
  VrResult<Real> r{std::vector<Real>(T * d), std::vector<Real>(T * d), std::vector<Real>(T * d, Real(0)),
                   std::vector<Real>(2, Real(0))};
  const k::ValueResidual<Real> vr{v1.data(), vn.data(), T, d, l1, l2};
  k::value_residual_forward(vr, r.out.data());
  std::vector<Real> scratch(k::value_residual_scratch_size(T));
  k::value_residual_backward(vr, g.data(), r.dvn.data(), r.dv1.data(), r.dlambda.data(), scratch.data());
  return r;
}

}  // namespace

TEST(ValueResidual, SpecVectorE) {
  const auto v1 = fill(70, {2, 4}), vn = fill(71, {2, 4}), g = fill(72, {2, 4});
  const auto a = run(v1, vn, g, 2, 4, 0.5, 0.5);
  expect_spec("E V' (0.5, 0.5)", a.out, {0.3125, 0.375, -0.1875, -0.625, -0.1875, -0.25, -0.0625, 0.0625});
  const auto b = run(v1, vn, g, 2, 4, 0.3, 0.7);
  expect_spec("E V' (0.3, 0.7)", b.out, {0.5875, 0.225, 0.0875, -0.775, 0.0875, -0.4, 0.2125, 0.3375});
  for (const auto* r : {&a, &b}) {
    expect_spec("E g_lambda", r->dlambda, {-0.125, -0.921875});
    std::vector<double> convex(1, 0.0);
    k::vres_parameter_gradients(k::VresMode::learned_convex, r->dlambda[0], r->dlambda[1], convex.data());
    expect_spec("E g_lambda (convex)", convex, {0.796875});
  }
}

TEST(ValueResidual, LambdasPerMode) {
  const double p[2] = {0.3, 0.9};
  EXPECT_EQ(k::vres_lambdas(k::VresMode::fixed, p, 2.0, 1.0), (std::array<double, 2>{0.5, 0.5}));
  EXPECT_EQ(k::vres_lambdas(k::VresMode::learned_convex, p, 2.0, 1.0), (std::array<double, 2>{0.3, 0.7}));
  EXPECT_EQ(k::vres_lambdas(k::VresMode::learned_pair, p, 2.0, 1.0), (std::array<double, 2>{0.3, 0.9}));
  EXPECT_EQ(k::vres_lambdas(k::VresMode::constant, p, 2.0, 1.0), (std::array<double, 2>{2.0, 1.0}));
  EXPECT_EQ(k::vres_parameter_count(k::VresMode::fixed), 0);
  EXPECT_EQ(k::vres_parameter_count(k::VresMode::learned_convex), 1);
  EXPECT_EQ(k::vres_parameter_count(k::VresMode::learned_pair), 2);
  EXPECT_EQ(k::vres_parameter_count(k::VresMode::constant), 0);
}

TEST(ValueResidual, GradientsMatchFiniteDifferences) {
  const int d = 6;
  const std::int64_t T = 70;
  auto v1 = random_vector<double>(T * d, 1), vn = random_vector<double>(T * d, 2), up = random_vector<double>(T * d, 3);
  for (auto mode : {k::VresMode::fixed, k::VresMode::learned_convex, k::VresMode::learned_pair, k::VresMode::constant}) {
    std::vector<double> params = {0.35, 0.8};
    std::vector<double> out(T * d);
    auto loss = [&] {
      const auto l = k::vres_lambdas(mode, params.data(), 2.0, 1.0);
      k::value_residual_forward(k::ValueResidual<double>{v1.data(), vn.data(), T, d, l[0], l[1]}, out.data());
      return weighted_sum(out, up);
    };
    const auto l = k::vres_lambdas(mode, params.data(), 2.0, 1.0);
    const auto r = run(v1, vn, up, T, d, l[0], l[1]);
    EXPECT_LT(max_rel_error(r.dv1, numeric_gradient(loss, v1)), 1e-8);
    EXPECT_LT(max_rel_error(r.dvn, numeric_gradient(loss, vn)), 1e-8);
    const int np = k::vres_parameter_count(mode);
    std::vector<double> dparams(2, 0.0);
    k::vres_parameter_gradients(mode, r.dlambda[0], r.dlambda[1], dparams.data());
    const auto num = numeric_gradient(loss, params);
    for (int i = 0; i < 2; ++i) {
      if (i < np) EXPECT_NEAR(dparams[i], num[i], 1e-7 * std::max(1.0, std::abs(num[i])));
      else EXPECT_EQ(dparams[i], 0.0);
    }
  }
}

TEST(ValueResidual, FloatMatchesDoubleAndThreadCountsAgreeBitForBit) {
  const int d = 37;
  const std::int64_t T = 1000;
  const auto v1 = random_vector<double>(T * d, 4), vn = random_vector<double>(T * d, 5), g = random_vector<double>(T * d, 6);
  const auto ref = run(v1, vn, g, T, d, 0.3, 0.7);
  const auto f1 = converted<float>(v1), fn = converted<float>(vn), fg = converted<float>(g);
  std::vector<VrResult<float>> r;
  for (int t : {1, 2, 3}) with_threads(t, [&] { r.push_back(run(f1, fn, fg, T, d, 0.3f, 0.7f)); });
  EXPECT_LT(max_rel_error(r[0].out, ref.out), 1e-6);
  EXPECT_LT(max_rel_error(r[0].dlambda, ref.dlambda), 1e-5);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(r[i].dlambda, r[0].dlambda);
    EXPECT_EQ(r[i].dv1, r[0].dv1);
  }
}

TEST(ValueResidual, ConstantZeroOneIsThePlainValueBitForBit) {
  // (0, 1): V' = 0 V_1 + 1 V_n = V_n exactly; V_1 receives zeros, V_n the gradient unchanged.
  const int d = 45;
  const std::int64_t T = 90;
  const auto v1 = converted<float>(random_vector<double>(T * d, 7)), vn = converted<float>(random_vector<double>(T * d, 8));
  const auto g = converted<float>(random_vector<double>(T * d, 9));
  const auto l = k::vres_lambdas(k::VresMode::constant, static_cast<const float*>(nullptr), 0.0f, 1.0f);
  const auto r = run(v1, vn, g, T, d, l[0], l[1]);
  EXPECT_EQ(std::memcmp(r.out.data(), vn.data(), vn.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(r.dvn.data(), g.data(), g.size() * sizeof(float)), 0);
  for (float x : r.dv1) EXPECT_EQ(x, 0.0f);
  // In place, as the model may run it: out over vn's buffer.
  auto inplace = vn;
  k::value_residual_forward(k::ValueResidual<float>{v1.data(), inplace.data(), T, d, 0.0f, 1.0f}, inplace.data());
  EXPECT_EQ(std::memcmp(inplace.data(), vn.data(), vn.size() * sizeof(float)), 0);
}
