#include "util/threads.hpp"
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.hpp"

namespace attnres {

template <class Real>
AdamW<Real>::AdamW(const ParamLayout& layout, AdamWConfig config) : config_(config) {
  for (const auto& p : layout.params()) ranges_.push_back({p.offset, p.numel, p.weight_decay()});
  m_.assign(static_cast<std::size_t>(layout.total()), Real(0));
  v_.assign(static_cast<std::size_t>(layout.total()), Real(0));
}

template <class Real>
void AdamW<Real>::step(std::span<Real> params, std::span<const Real> grads, double lr) {
  require(params.size() == m_.size() && grads.size() == m_.size(), "AdamW: buffer size mismatch");
  ++t_;
  const double b1 = config_.beta1, b2 = config_.beta2;
  const Real step_size = static_cast<Real>(lr / (1.0 - std::pow(b1, static_cast<double>(t_))));
  const Real bias2_sqrt = static_cast<Real>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_))));
  const Real decay = static_cast<Real>(1.0 - lr * config_.weight_decay);
  const Real rb1 = static_cast<Real>(b1), rb2 = static_cast<Real>(b2), eps = static_cast<Real>(config_.eps);
  const Real one_b1 = static_cast<Real>(1.0 - b1), one_b2 = static_cast<Real>(1.0 - b2);
  for (const Range& r : ranges_) {
    Real* p = params.data() + r.offset;
    const Real* g = grads.data() + r.offset;
    Real* m = m_.data() + r.offset;
    Real* v = v_.data() + r.offset;
    const bool wd = r.decay && config_.weight_decay != 0;
#pragma omp parallel for simd schedule(static) if (r.numel >= kParallelMin)
    for (std::int64_t i = 0; i < r.numel; ++i) {
      if (wd) p[i] *= decay;
      m[i] = rb1 * m[i] + one_b1 * g[i];
      v[i] = rb2 * v[i] + one_b2 * g[i] * g[i];
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
    }
  }
}

template <class Real>
double clip_grad_norm(std::span<Real> grads, double max_norm) {
  constexpr std::size_t kChunk = 1 << 16;
  const std::size_t chunks = (grads.size() + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::size_t c = 0; c < chunks; ++c) {
    double s = 0;
    const std::size_t end = std::min(grads.size(), (c + 1) * kChunk);
    for (std::size_t i = c * kChunk; i < end; ++i) s += static_cast<double>(grads[i]) * grads[i];
    partial[c] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      const Real c = static_cast<Real>(coef);
#pragma omp parallel for simd schedule(static) if (grads.size() >= std::size_t(kParallelMin))
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] *= c;
    }
  }
  return norm;
}

LrDecay parse_lr_decay(const std::string& text) {
  for (auto d : kLrDecays)
    if (to_string(d) == text) return d;
  fail("unknown learning-rate decay '", text, "' (expected cosine, wsd or constant)");
}

std::string to_string(LrDecay decay) {
  switch (decay) {
    case LrDecay::cosine: return "cosine";
    case LrDecay::wsd: return "wsd";
    case LrDecay::constant: return "constant";
  }
  return "?";
}

double LrSchedule::at(std::int64_t step) const {
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double floor = min_lr_ratio * max_lr;
  switch (decay) {
    case LrDecay::constant: return max_lr;
    case LrDecay::cosine: {
      const double p = static_cast<double>(step - warmup_steps) /
                       static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
      return floor + (max_lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, p)));
    }
    case LrDecay::wsd: {
      const auto decay_start =
          total_steps - static_cast<std::int64_t>(std::floor(decay_fraction * static_cast<double>(total_steps) + 0.5));
      if (step < decay_start) return max_lr;
      const double frac = std::min(1.0, static_cast<double>(step - decay_start) /
                                            static_cast<double>(std::max<std::int64_t>(1, total_steps - decay_start)));
      return max_lr + (floor - max_lr) * frac;
    }
  }
  return max_lr;
}

template class AdamW<float>;
template class AdamW<double>;
template double clip_grad_norm<float>(std::span<float>, double);
template double clip_grad_norm<double>(std::span<double>, double);

}  // namespace attnres
