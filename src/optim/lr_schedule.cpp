#include "optim/lr_schedule.hpp"

#include "core/error.hpp"

#include <cmath>

namespace pf {

double LrSchedule::at(int64_t s) const {
  PF_CHECK(s >= 0, "negative step {}", s);
  if (s < warmup_steps) return lr * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
  if (s >= total_steps) return 0.0;
  double progress = static_cast<double>(s - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return lr * std::pow(1.0 - progress, power);
}

LrSchedule make_lr_schedule(const OptimConfig& cfg, int64_t total_steps) {
  if (cfg.warmup_steps < 0) usage_error("optim.warmup_steps", "must be >= 0, got {}", cfg.warmup_steps);
  if (total_steps < 1) usage_error("train.steps", "must be >= 1, got {}", total_steps);
  return {cfg.lr, cfg.warmup_steps, total_steps, cfg.decay_power};
}

}  // namespace pf
