#include "util/threads.hpp"
#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "util/error.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace attnres {

namespace {

// One range of the update: torch's AdamW per element, written once for every type.
template <class Real>
struct AdamWConstants {
  Real step_size, bias2_sqrt, decay, rb1, rb2, eps, one_b1, one_b2;
};

template <class Real>
inline void adamw_element(Real& p, Real& m, Real& v, Real g, bool wd, const AdamWConstants<Real>& k) {
  if (wd) p *= k.decay;
  m = k.rb1 * m + k.one_b1 * g;
  v = k.rb2 * v + k.one_b2 * g * g;
  p -= k.step_size * m / (std::sqrt(v) / k.bias2_sqrt + k.eps);
}

template <class Real>
void adamw_range(Real* p, Real* m, Real* v, const Real* g, std::int64_t n, bool wd, const AdamWConstants<Real>& k) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) adamw_element(p[i], m[i], v[i], g[i], wd, k);
}

#if defined(__AVX2__) && defined(__FMA__)
// float on 8 lanes. GCC leaves the loop above scalar (std::sqrt may set errno) and contracts
// m = rb1 m + (1-b1) g and v = rb2 v + ((1-b2) g) g into one FMA each (-ffp-contract=fast, the
// GNU default), fusing the products with m and v; this is the same arithmetic, operation for
// operation, so the results are the scalar loop's bit for bit (Fp32Golden hashes the parameters
// after AdamW, both fp32 GEMM backends), eight at a time.
template <>
void adamw_range<float>(float* p, float* m, float* v, const float* g, std::int64_t n, bool wd,
                        const AdamWConstants<float>& k) {
  const std::int64_t vec = n / 8 * 8;
  const __m256 decay = _mm256_set1_ps(k.decay), rb1 = _mm256_set1_ps(k.rb1), rb2 = _mm256_set1_ps(k.rb2);
  const __m256 one_b1 = _mm256_set1_ps(k.one_b1), one_b2 = _mm256_set1_ps(k.one_b2);
  const __m256 step = _mm256_set1_ps(k.step_size), bias2 = _mm256_set1_ps(k.bias2_sqrt), eps = _mm256_set1_ps(k.eps);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < vec; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 gi = _mm256_loadu_ps(g + i);
    if (wd) {
      pi = _mm256_mul_ps(pi, decay);
      // The scalar loop stores p * decay before subtracting the step: keep GCC from contracting
      // the two into one FMA here (GCC's _mm256_mul_ps is a plain vector multiply it may fuse).
      asm("" : "+x"(pi));
    }
    const __m256 mi = _mm256_fmadd_ps(_mm256_loadu_ps(m + i), rb1, _mm256_mul_ps(one_b1, gi));
    const __m256 vi = _mm256_fmadd_ps(_mm256_loadu_ps(v + i), rb2, _mm256_mul_ps(_mm256_mul_ps(one_b2, gi), gi));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bias2), eps);
    pi = _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), denom));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
  }
  for (std::int64_t i = vec; i < n; ++i) adamw_element(p[i], m[i], v[i], g[i], wd, k);
}
#endif

}  // namespace

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
  const AdamWConstants<Real> k{step_size, bias2_sqrt, decay, rb1, rb2, eps, one_b1, one_b2};
  for (const Range& r : ranges_) {
    const bool wd = r.decay && config_.weight_decay != 0;
    adamw_range(params.data() + r.offset, m_.data() + r.offset, v_.data() + r.offset, grads.data() + r.offset,
                r.numel, wd, k);
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
