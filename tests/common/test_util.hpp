// Helpers shared by the tests: random tensors, error measures, finite differences.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "util/rng.hpp"
#include "util/threads.hpp"

namespace attnres::testing {

template <class Real>
std::vector<Real> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<Real> v(n);
  for (auto& x : v) x = static_cast<Real>(rng.normal() * scale);
  return v;
}

// Whether two buffers hold the same bits (NaN payloads and signed zeros included).
template <class Real>
bool same_bits(const std::vector<Real>& a, const std::vector<Real>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Real)) == 0;
}

// max |a - b| / max |b|: a dropped term shows up as an O(1) error.
template <class A, class B>
double max_rel_error(std::span<const A> a, std::span<const B> b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref == 0 ? diff : diff / ref;
}

template <class A, class B>
double max_rel_error(const std::vector<A>& a, const std::vector<B>& b) {
  return max_rel_error(std::span<const A>(a), std::span<const B>(b));
}

// Central-difference gradient of f with respect to every element of x (double precision).
inline std::vector<double> numeric_gradient(const std::function<double()>& f, std::span<double> x,
                                            double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + h;
    const double plus = f();
    x[i] = old - h;
    const double minus = f();
    x[i] = old;
    g[i] = (plus - minus) / (2 * h);
  }
  return g;
}

// sum(w * y): turns an op's output into a scalar loss with upstream gradient w.
inline double weighted_sum(std::span<const double> y, std::span<const double> w) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
  return s;
}

// Runs f() with n OpenMP (and OpenBLAS) threads, then restores the previous count.
template <class F>
void with_threads(int n, F&& f) {
  const int before = num_threads();
  set_num_threads(n);
  f();
  set_num_threads(before);
}

template <class To, class From>
std::vector<To> converted(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

}  // namespace attnres::testing
