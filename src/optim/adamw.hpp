// AdamW with decoupled weight decay on matrices only, global gradient-norm clipping, and
// the learning-rate schedules (linear warmup, then cosine or warmup-stable-decay).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/param_layout.hpp"
#include "util/huge_pages.hpp"

namespace attnres {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// Follows torch.optim.AdamW (torch 1.13 single-tensor path) operation for operation:
//   p *= 1 - lr*wd (matrices only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
template <class Real>
class AdamW {
 public:
  AdamW(const ParamLayout& layout, AdamWConfig config);

  void step(std::span<Real> params, std::span<const Real> grads, double lr);

  std::int64_t steps() const { return t_; }
  std::span<Real> m() { return m_; }
  std::span<Real> v() { return v_; }
  std::span<const Real> m() const { return m_; }
  std::span<const Real> v() const { return v_; }
  void set_steps(std::int64_t t) { t_ = t; }
  const AdamWConfig& config() const { return config_; }

 private:
  struct Range {
    std::int64_t offset, numel;
    bool decay;
  };
  AdamWConfig config_;
  std::vector<Range> ranges_;
  HugePageVector<Real> m_, v_;  // on huge pages where the kernel offers them
  std::int64_t t_ = 0;
};

// Global L2 norm of all gradients (accumulated in double, fixed order). If max_norm > 0 and
// max_norm / (norm + 1e-6) < 1, scales the gradients by that factor (torch's clip_grad_norm_).
// Returns the norm before clipping.
template <class Real>
double clip_grad_norm(std::span<Real> grads, double max_norm);

enum class LrDecay { cosine, wsd, constant };
inline constexpr std::array kLrDecays = {LrDecay::cosine, LrDecay::wsd, LrDecay::constant};
LrDecay parse_lr_decay(const std::string& text);
std::string to_string(LrDecay decay);

// Learning rate of update `step` (0-based):
//   step < warmup: max_lr * (step+1) / warmup
//   cosine: floor + (max_lr - floor) * (1 + cos(pi * p)) / 2, p = (step-warmup) / max(1, total-warmup)
//   wsd: max_lr until decay_start = total - round(decay_fraction * total), then linear to floor at total
// with floor = min_lr_ratio * max_lr.
struct LrSchedule {
  double max_lr = 1e-3;
  double min_lr_ratio = 0.1;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  LrDecay decay = LrDecay::cosine;
  double decay_fraction = 0.2;  // wsd only

  double at(std::int64_t step) const;
};

}  // namespace attnres
