#pragma once
// Learning-rate schedule of NVIDIA's BERT recipe: linear warm-up, then polynomial decay.
//
// Steps are numbered from 0 (the first optimizer step of the run is step 0). With peak rate lr,
// W warm-up steps and T total steps, step s uses
//   s <  W:      lr * (s + 1) / W                      (step 0 gets lr / W, step W - 1 gets lr)
//   W <= s < T:  lr * (1 - (s - W) / (T - W))^power    (step W gets lr, step T - 1 gets lr / (T - W)^power)
//   s >= T:      0
// so no step of the run has a zero rate, and the decay reaches 0 exactly one step after the last.
#include "config/config.hpp"

#include <cstdint>

namespace pf {

struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double power = 0.5;

  double at(int64_t step) const;
};

// From optim.lr, optim.warmup_steps, optim.decay_power and the run's length in steps.
LrSchedule make_lr_schedule(const OptimConfig& cfg, int64_t total_steps);

}  // namespace pf
