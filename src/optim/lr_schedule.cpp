#include "optim/lr_schedule.hpp"

#include "core/error.hpp"

#include <cmath>
#include <numbers>

namespace pf {

double LrSchedule::at(int64_t s) const {
  PF_CHECK(s >= 0, "negative step {}", s);
  if (s < warmup_steps) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
  if (decay == LrDecay::Constant) return lr;
  if (s >= total_steps) return min_lr;
  const double p = static_cast<double>(s - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  double f = 1;
  switch (decay) {
    case LrDecay::Poly: f = std::pow(1.0 - p, power); break;
    case LrDecay::Linear: f = 1.0 - p; break;
    case LrDecay::Cosine: f = 0.5 * (1.0 + std::cos(std::numbers::pi * p)); break;
    case LrDecay::Constant: break;
  }
  return min_lr + (lr - min_lr) * f;
}

LrSchedule make_lr_schedule(const OptimConfig& cfg, int64_t total_steps) {
  if (cfg.warmup_steps < 0) usage_error("optim.warmup_steps", "must be >= 0, got {}", cfg.warmup_steps);
  if (total_steps < 1) usage_error("train.steps", "must be >= 1, got {}", total_steps);
  return {cfg.lr, cfg.warmup_steps, total_steps, cfg.schedule, cfg.decay_power, cfg.min_lr};
}

}  // namespace pf
