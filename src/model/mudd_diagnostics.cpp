// The MUDD trunk's depth view (model/mudd_trunk.hpp): the per-token weights of every DA way, the
// norms of the sources it mixed, the route distributions of baselines-spec §6.5 and the token means
// of the weights (the connections).
#include <algorithm>
#include <cmath>
#include <memory>

#include "model/diagnostics.hpp"
#include "model/mudd_trunk.hpp"
#include "util/error.hpp"

namespace attnres {

void mudd_way_distribution(std::span<const float> dw, std::span<const float> norms, std::span<double> p) {
  require(dw.size() == p.size() && norms.size() == p.size() && !p.empty(), "mudd_way_distribution: ", dw.size(),
          " weights, ", norms.size(), " norms and ", p.size(), " outputs");
  double sum = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    p[j] = std::abs(double(dw[j])) * double(norms[j]);
    sum += p[j];
  }
  if (sum == 0) {  // the way mixes nothing in: see model/diagnostics.hpp
    std::fill(p.begin(), p.end(), 0.0);
    p.back() = 1;
    return;
  }
  for (double& x : p) x /= sum;  // (NaN weights stay NaN, as a diverged model's softmax would)
}

namespace mudd {
namespace {

// The checks of a query about DA module `da` and one token of the last forward pass (n_tok tokens),
// with an output of one value per source.
void check_mudd_query(const ModelConfig& config, int da, std::int64_t token, std::int64_t n_tok, std::size_t size) {
  require(config.residual == ResidualMode::mudd && da >= 0 && da < config.n_layers, "the model has no MUDD DA ", da);
  require(token >= 0 && token < n_tok, "token index out of range");
  require(static_cast<int>(size) == config.mudd_da_sources(da), "MUDD DA ", da, " has ", config.mudd_da_sources(da),
          " sources, not ", size);
}

}  // namespace

template <class Real>
void MuddTrunk<Real>::mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const {
  check_mudd_query(p_.config, da, token, n_tok_, dw.size());
  const int C = p_.config.mudd_da_ways(da), S = p_.config.mudd_da_sources(da);
  require(way >= 0 && way < C, "MUDD DA ", da, " has no way ", way);
  const Real* w = p_.config.mudd_dynamic ? blocks_[static_cast<std::size_t>(da)].dw + token * C * S
                                       : da_w_[static_cast<std::size_t>(da)].a;
  std::copy(w + way * S, w + (way + 1) * S, dw.begin());
}

template <class Real>
void MuddTrunk<Real>::mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const {
  check_mudd_query(p_.config, da, token, n_tok_, norms.size());
  const Real* sources[k::kMaxSources];
  const k::MuddDa<Real> view = mudd_da(da, sources);  // the very buffers the DA mixed
  for (int j = 0; j < view.n_sources; ++j) {
    const Real* x = view.sources[j] + token * view.d;
    double ss = 0;
    for (int e = 0; e < view.d; ++e) ss += double(x[e]) * double(x[e]);
    norms[static_cast<std::size_t>(j)] = static_cast<Real>(std::sqrt(ss));
  }
}

template <class Real>
void MuddTrunk<Real>::route_distributions(int index, std::int64_t token, std::span<double> p) const {
  if (index == 0) {  // the embedding alone, on every way
    std::fill(p.begin(), p.end(), 1.0);
    return;
  }
  const int da = index - 1;
  const auto n = static_cast<std::size_t>(p_.config.mudd_da_sources(da));
  // (Also tells the compiler the copies below stay inside the arrays.)
  require(n >= 1 && n <= k::kMaxSources, "MUDD DA ", da, " has ", n, " sources, outside 1..", k::kMaxSources);
  Real norms[k::kMaxSources], dw[k::kMaxSources];
  float norms_f[k::kMaxSources], dw_f[k::kMaxSources];  // (the distribution is defined on fp32 weights)
  mudd_source_norms(da, token, std::span<Real>(norms, n));
  std::copy(norms, norms + n, norms_f);
  for (int way = 0; way < 3; ++way) {  // Q, K, V (kernels/mudd.hpp's way order; R is the fourth)
    mudd_weights(da, way, token, std::span<Real>(dw, n));
    std::copy(dw, dw + n, dw_f);
    mudd_way_distribution(std::span<const float>(dw_f, n), std::span<const float>(norms_f, n),
                          p.subspan(way * n, n));
  }
}

// The token means of every DA's mixing weights, per way ("mudd.q", "mudd.k", "mudd.v", "mudd.r";
// the last DA writes R alone): one row per DA module (target i+1: the block it feeds, n_layers:
// the final norm), sources 0..i+1.
template <class Real>
class MuddMixingSum final : public MixingSum {
 public:
  MuddMixingSum(const MuddTrunk<Real>& trunk, const ModelConfig& c)
      : trunk_(trunk), c_(c), dw_(static_cast<std::size_t>(c.n_layers + 1)) {
    static constexpr const char* kWayNames[] = {"mudd.q", "mudd.k", "mudd.v", "mudd.r"};
    const int max_ways = c.mudd_da_ways(0);
    // sums_[w] is way w of the 4-way DAs; R is the last way of every DA (and the only one of the last).
    for (int w = 0; w < max_ways; ++w) sums_.push_back({max_ways == 1 ? "mudd.r" : kWayNames[w], {}});
    for (int i = 0; i < c.n_layers; ++i) {
      const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i);
      for (int w = 0; w < C; ++w) {
        ConnectionRow row;
        row.target = i + 1;
        for (int j = 0; j < S; ++j) row.sources.push_back(j);
        row.weights.assign(static_cast<std::size_t>(S), 0.0);
        way(i, w).rows.push_back(std::move(row));
      }
    }
  }

  void add_pass() override {
    const std::int64_t n_tok = trunk_.tokens();
    for (int i = 0; i < c_.n_layers; ++i) {
      const int C = c_.mudd_da_ways(i), S = c_.mudd_da_sources(i);
      for (int w = 0; w < C; ++w) {
        std::vector<double>& sum = way(i, w).rows[static_cast<std::size_t>(i)].weights;
        for (std::int64_t t = 0; t < n_tok; ++t) {
          trunk_.mudd_weights(i, w, t, std::span<Real>(dw_.data(), static_cast<std::size_t>(S)));
          for (int j = 0; j < S; ++j) sum[static_cast<std::size_t>(j)] += dw_[static_cast<std::size_t>(j)];
        }
      }
    }
    tokens_ += n_tok;
  }
  std::vector<Connections> connections() const override {
    std::vector<Connections> out = sums_;
    for (auto& w : out)
      for (auto& row : w.rows)
        for (double& x : row.weights) x /= double(tokens_);
    return out;
  }

 private:
  Connections& way(int da, int w) {
    const int max_ways = c_.mudd_da_ways(0);
    return sums_[static_cast<std::size_t>(c_.mudd_da_ways(da) == max_ways ? w : max_ways - 1)];
  }

  const MuddTrunk<Real>& trunk_;
  const ModelConfig& c_;
  std::vector<Connections> sums_;
  std::vector<Real> dw_;
  std::int64_t tokens_ = 0;
};

template <class Real>
std::unique_ptr<MixingSum> MuddTrunk<Real>::mixing_sum() const {
  return std::make_unique<MuddMixingSum<Real>>(*this, p_.config);
}

}  // namespace mudd

template <class Real>
void Model<Real>::mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const {
  const auto* trunk = dynamic_cast<const mudd::MuddTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no MUDD DA ", da);
  trunk->mudd_weights(da, way, token, dw);
}

template <class Real>
void Model<Real>::mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const {
  const auto* trunk = dynamic_cast<const mudd::MuddTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no MUDD DA ", da);
  trunk->mudd_source_norms(da, token, norms);
}

#define ATTNRES_MUDD_DIAGNOSTICS(Real)                                                           \
  template void Model<Real>::mudd_weights(int, int, std::int64_t, std::span<Real>) const;          \
  template void Model<Real>::mudd_source_norms(int, std::int64_t, std::span<Real>) const;          \
  template void mudd::MuddTrunk<Real>::route_distributions(int, std::int64_t, std::span<double>) const; \
  template std::unique_ptr<MixingSum> mudd::MuddTrunk<Real>::mixing_sum() const;
ATTNRES_MUDD_DIAGNOSTICS(float)
ATTNRES_MUDD_DIAGNOSTICS(double)
#undef ATTNRES_MUDD_DIAGNOSTICS

}  // namespace attnres
