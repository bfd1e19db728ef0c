// The input generators and the comparison of shared/docs/baselines-spec.md's float64 test
// vectors (§0 "Test-vector inputs"): fill(seed, shape, scale) and checksum(t), bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

namespace attnres::testing {

// Element m (row-major flat index) = scale * (((m^3 + 3m^2 + 5m + 11 seed) mod 17) - 8) / 8,
// in int64: exact binary fractions. fill(1, {5}) = [0.375, -0.625, -0.125, 0.5, -0.125].
inline std::vector<double> fill(std::int64_t seed, std::initializer_list<std::int64_t> shape, double scale = 1.0) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t m = 0; m < n; ++m) {
    const std::int64_t q = (m * m * m + 3 * m * m + 5 * m + 11 * seed) % 17;
    v[static_cast<std::size_t>(m)] = scale * static_cast<double>(q - 8) / 8.0;
  }
  return v;
}

// 1 + fill(...): the spec's norm weights and HC's B.
inline std::vector<double> one_plus_fill(std::int64_t seed, std::initializer_list<std::int64_t> shape, double scale) {
  std::vector<double> v = fill(seed, shape, scale);
  for (double& x : v) x += 1.0;
  return v;
}

// sum_m t_m * fill(99, {numel})_m
inline double checksum(const std::vector<double>& t) {
  const std::vector<double> w = fill(99, {static_cast<std::int64_t>(t.size())});
  double s = 0;
  for (std::size_t m = 0; m < t.size(); ++m) s += t[m] * w[m];
  return s;
}

// [rows, cols] row-major -> [cols, rows]: the spec writes right-multiplied matrices (x W,
// W: in x out); the kernels store them [out, in] like nn.Linear.
inline std::vector<double> transposed(const std::vector<double>& a, int rows, int cols) {
  std::vector<double> t(a.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = a[static_cast<std::size_t>(r * cols + c)];
  return t;
}

// The spec's acceptance rule |a - b| <= 1e-9 max(1, |b|), element by element; prints the worst
// error (the test report quotes it) and returns it.
inline double expect_spec(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                          std::size_t offset = 0) {
  EXPECT_GE(got.size(), offset + want.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < want.size() && offset + i < got.size(); ++i) {
    const double a = got[offset + i], b = want[i];
    const double err = std::abs(a - b);
    worst = std::max(worst, err / std::max(1.0, std::abs(b)));
    EXPECT_LE(err, 1e-9 * std::max(1.0, std::abs(b))) << what << "[" << i << "]: " << a << " vs " << b;
  }
  std::printf("[spec] %-40s max err %.2e\n", what.c_str(), worst);
  return worst;
}

inline double expect_spec(const std::string& what, double got, double want) {
  return expect_spec(what, std::vector<double>{got}, std::vector<double>{want});
}

// The spec's toy sublayer branch y = tanh(h M) over token rows of d (M: d x d, right-multiplied),
// and its input gradient given dy.
inline std::vector<double> tanh_branch(const std::vector<double>& h, const std::vector<double>& m, int d) {
  std::vector<double> y(h.size(), 0.0);
  for (std::size_t t = 0; t < h.size() / d; ++t)
    for (int c = 0; c < d; ++c) {
      double u = 0;
      for (int e = 0; e < d; ++e) u += h[t * d + e] * m[e * d + c];
      y[t * d + c] = std::tanh(u);
    }
  return y;
}

inline std::vector<double> tanh_branch_backward(const std::vector<double>& dy, const std::vector<double>& y,
                                                const std::vector<double>& m, int d) {
  std::vector<double> dh(dy.size(), 0.0);
  for (std::size_t t = 0; t < dy.size() / d; ++t)
    for (int c = 0; c < d; ++c) {
      const double gu = dy[t * d + c] * (1 - y[t * d + c] * y[t * d + c]);
      for (int e = 0; e < d; ++e) dh[t * d + e] += gu * m[e * d + c];
    }
  return dh;
}

}  // namespace attnres::testing
