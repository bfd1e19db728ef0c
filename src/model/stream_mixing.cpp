#include "model/stream_mixing.hpp"

#include <algorithm>
#include <cmath>

#include "util/error.hpp"

namespace attnres {

namespace {

std::size_t coefficient_count(int n) { return static_cast<std::size_t>(n) * (n + 2); }

// One sublayer's coefficients in a token's.
std::span<const double> sublayer(std::span<const double> coefficients, int n, int j) {
  return coefficients.subspan(static_cast<std::size_t>(j) * coefficient_count(n), coefficient_count(n));
}

}  // namespace

Gain amax_gain(std::span<const double> m, int n) {
  require(m.size() == static_cast<std::size_t>(n) * n, "amax_gain: ", m.size(), " values are not a ", n, " x ", n,
          " matrix");
  Gain g;
  for (int i = 0; i < n; ++i) {
    double row = 0, column = 0;
    for (int j = 0; j < n; ++j) {
      row += m[static_cast<std::size_t>(i * n + j)];
      column += m[static_cast<std::size_t>(j * n + i)];
    }
    g.forward = std::max(g.forward, std::abs(row));
    g.backward = std::max(g.backward, std::abs(column));
  }
  return g;
}

UnfoldedConnections::UnfoldedConnections(int n, int n_sublayers, double readout_scale)
    : n_(n),
      sublayers_(n_sublayers),
      readout_scale_(readout_scale),
      sum_(static_cast<std::size_t>(n_sublayers + 1) * (n_sublayers + 2) / 2, 0.0),
      carried_(static_cast<std::size_t>(n_sublayers + 1) * n, 0.0),
      next_(static_cast<std::size_t>(n)) {
  require(n >= 1 && n_sublayers >= 1, "unfolded connections need streams and sublayers");
}

void UnfoldedConnections::add(std::span<const double> coefficients) {
  const auto n = static_cast<std::size_t>(n_);
  require(coefficients.size() == static_cast<std::size_t>(sublayers_) * coefficient_count(n_),
          "unfolded connections: a token's coefficients have the wrong size");
  // carried_ row s: source s's weight in each of the current streams.
  std::fill(carried_.begin(), carried_.begin() + static_cast<std::ptrdiff_t>(n), 1.0);  // the embedding's copies
  for (int j = 0; j < sublayers_; ++j) {
    const std::span<const double> c = sublayer(coefficients, n_, j);
    double* row = sum_.data() + static_cast<std::size_t>(j) * (j + 1) / 2;
    for (int s = 0; s <= j; ++s) {
      double* w = carried_.data() + static_cast<std::size_t>(s) * n;
      double read = 0;
      for (std::size_t i = 0; i < n; ++i) read += c[i * (n + 1)] * w[i];  // A_m: the read
      row[s] += read;
      for (std::size_t k = 0; k < n; ++k) {  // the write: new stream k = sum_i alpha[i, k+1] H_i
        double x = 0;
        for (std::size_t i = 0; i < n; ++i) x += c[i * (n + 1) + 1 + k] * w[i];
        next_[k] = x;
      }
      std::copy(next_.begin(), next_.end(), w);
    }
    // Sublayer j's output enters stream k with weight beta_k.
    std::copy(c.begin() + static_cast<std::ptrdiff_t>(n * (n + 1)), c.end(),
              carried_.begin() + static_cast<std::ptrdiff_t>((j + 1) * n));
  }
  double* exit = sum_.data() + static_cast<std::size_t>(sublayers_) * (sublayers_ + 1) / 2;
  for (int s = 0; s <= sublayers_; ++s) {
    const double* w = carried_.data() + static_cast<std::size_t>(s) * n;
    double read = 0;
    for (std::size_t i = 0; i < n; ++i) read += w[i];
    exit[s] += readout_scale_ * read;
  }
  ++tokens_;
}

Connections UnfoldedConnections::mean(const std::string& name) const {
  require(tokens_ > 0, "unfolded connections of no token");
  Connections out;
  out.name = name;
  for (int k = 0; k <= sublayers_; ++k) {
    ConnectionRow row;
    row.target = k;
    const double* sum = sum_.data() + static_cast<std::size_t>(k) * (k + 1) / 2;
    for (int s = 0; s <= k; ++s) {
      row.sources.push_back(s);
      row.weights.push_back(sum[s] / static_cast<double>(tokens_));
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

AmaxGainSum::AmaxGainSum(int n, int n_sublayers)
    : n_(n),
      sublayers_(n_sublayers),
      r_(static_cast<std::size_t>(n) * n),
      product_(r_.size()),
      next_(r_.size()) {
  require(n >= 1 && n_sublayers >= 1, "Amax gains need streams and sublayers");
}

void AmaxGainSum::add(std::span<const double> coefficients) {
  const auto n = static_cast<std::size_t>(n_);
  require(coefficients.size() == static_cast<std::size_t>(sublayers_) * coefficient_count(n_),
          "Amax gain: a token's coefficients have the wrong size");
  std::fill(product_.begin(), product_.end(), 0.0);
  for (std::size_t i = 0; i < n; ++i) product_[i * n + i] = 1;
  for (int j = 0; j < sublayers_; ++j) {
    const std::span<const double> c = sublayer(coefficients, n_, j);
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t i = 0; i < n; ++i) r_[k * n + i] = c[i * (n + 1) + 1 + k];
    const Gain layer = amax_gain(r_, n_);
    g_.layer_forward_max = std::max(g_.layer_forward_max, layer.forward);
    g_.layer_backward_max = std::max(g_.layer_backward_max, layer.backward);
    for (std::size_t k = 0; k < n; ++k)  // product = R_j product: sublayer j maps after the ones before
      for (std::size_t col = 0; col < n; ++col) {
        double x = 0;
        for (std::size_t i = 0; i < n; ++i) x += r_[k * n + i] * product_[i * n + col];
        next_[k * n + col] = x;
      }
    product_.swap(next_);
  }
  const Gain composite = amax_gain(product_, n_);
  g_.composite_forward_mean += composite.forward;
  g_.composite_backward_mean += composite.backward;
  g_.composite_forward_max = std::max(g_.composite_forward_max, composite.forward);
  g_.composite_backward_max = std::max(g_.composite_backward_max, composite.backward);
  ++tokens_;
}

AmaxGain AmaxGainSum::result() const {
  require(tokens_ > 0, "Amax gains of no token");
  AmaxGain g = g_;
  // sum / count of equal values (static HC's) can round above their max: a mean never exceeds it.
  g.composite_forward_mean = std::min(g.composite_forward_mean / static_cast<double>(tokens_), g.composite_forward_max);
  g.composite_backward_mean =
      std::min(g.composite_backward_mean / static_cast<double>(tokens_), g.composite_backward_max);
  return g;
}

}  // namespace attnres
