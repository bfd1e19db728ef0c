#include "analysis/meta.hpp"

#include <boost/math/distributions/chi_squared.hpp>
#include <boost/math/distributions/normal.hpp>
#include <cmath>

#include "analysis/stats.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

struct Weighted {
  double sum_w = 0, mean = 0;
};

// Σ w_i and the weighted mean with w_i = 1/(v_i + tau2).
Weighted weighted_mean(std::span<const double> y, std::span<const double> v, double tau2) {
  Weighted out;
  double sum_wy = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double w = 1 / (v[i] + tau2);
    out.sum_w += w;
    sum_wy += w * y[i];
  }
  out.mean = sum_wy / out.sum_w;
  return out;
}

double reml_tau2(std::span<const double> y, std::span<const double> v, double start) {
  double tau2 = start;
  for (int it = 0; it < 1000; ++it) {
    const Weighted m = weighted_mean(y, v, tau2);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double w = 1 / (v[i] + tau2);
      num += w * w * ((y[i] - m.mean) * (y[i] - m.mean) - v[i]);
      den += w * w;
    }
    const double next = std::max(0.0, num / den + 1 / m.sum_w);
    if (std::abs(next - tau2) <= 1e-15 * std::max(1.0, tau2)) return next;
    tau2 = next;
  }
  return tau2;
}

}  // namespace

double chi_squared_upper_p(double x, double df) {
  require(df > 0, "chi-squared: degrees of freedom must be > 0 (got ", df, ")");
  if (!(x > 0)) return 1.0;
  return boost::math::cdf(boost::math::complement(boost::math::chi_squared_distribution<double>(df), x));
}

MetaAnalysis random_effects_meta(std::span<const double> y, std::span<const double> v, double level) {
  require(!y.empty() && y.size() == v.size(), "meta-analysis: ", y.size(), " estimates and ", v.size(),
          " variances (need the same number, at least one)");
  for (std::size_t i = 0; i < v.size(); ++i)
    require(std::isfinite(y[i]) && std::isfinite(v[i]) && v[i] > 0, "meta-analysis: estimate ", i,
            " has y = ", y[i], ", v = ", v[i], " (need finite y and v > 0)");
  MetaAnalysis m;
  m.k = static_cast<int>(y.size());
  const Weighted fe = weighted_mean(y, v, 0);
  m.fixed_mean = fe.mean;
  m.fixed_se = 1 / std::sqrt(fe.sum_w);
  if (m.k == 1) {
    m.mean = y[0];
    return m;
  }
  double q = 0, sum_w2 = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double w = 1 / v[i];
    q += w * (y[i] - fe.mean) * (y[i] - fe.mean);
    sum_w2 += w * w;
  }
  const double df = m.k - 1;
  m.q = q;
  m.q_df = df;
  m.q_p = chi_squared_upper_p(q, df);
  m.i2 = q > 0 ? std::max(0.0, (q - df) / q) : 0.0;
  m.tau2_dl = std::max(0.0, (q - df) / (fe.sum_w - sum_w2 / fe.sum_w));
  m.tau2_reml = reml_tau2(y, v, m.tau2_dl);

  const Weighted re = weighted_mean(y, v, m.tau2_dl);
  m.mean = re.mean;
  m.se_dl = 1 / std::sqrt(re.sum_w);
  const double z = boost::math::quantile(boost::math::normal_distribution<double>(), 0.5 + level / 2);
  m.dl_ci_low = m.mean - z * m.se_dl;
  m.dl_ci_high = m.mean + z * m.se_dl;
  double hk = 0;
  for (std::size_t i = 0; i < y.size(); ++i) hk += (y[i] - re.mean) * (y[i] - re.mean) / (v[i] + m.tau2_dl);
  m.hk_q = hk / df;
  const double tq = student_t_quantile(0.5 + level / 2, df);
  m.se_hk = std::sqrt(m.hk_q / re.sum_w);
  m.hk_ci_low = m.mean - tq * m.se_hk;
  m.hk_ci_high = m.mean + tq * m.se_hk;
  m.se = std::sqrt(std::max(m.hk_q, 1.0) / re.sum_w);
  m.ci_low = m.mean - tq * m.se;
  m.ci_high = m.mean + tq * m.se;
  m.t = m.mean / m.se;
  m.p_value = student_t_two_sided_p(m.t, df);
  return m;
}

}  // namespace attnres::analysis
