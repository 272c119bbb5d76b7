#pragma once
// Learning-rate schedules: linear warm-up, then a decay from the peak lr to the floor min_lr
// (optim.schedule; NVIDIA's BERT recipe, which the PipeFisher paper trained with, is poly with
// power 0.5 and floor 0).
//
// Steps are numbered from 0 (the first optimizer step of the run is step 0). With peak rate lr,
// floor m, W warm-up steps and T total steps, step s uses
//   s <  W:      lr * (s + 1) / W                      (step 0 gets lr / W, step W - 1 gets lr)
//   W <= s < T:  m + (lr - m) * f(p), p = (s - W) / (T - W) in [0, 1)
//     poly      f = (1 - p)^power                        (the last step gets m + (lr - m) / (T - W)^power)
//     linear    f = 1 - p
//     cosine    f = (1 + cos(pi p)) / 2
//     constant  f = 1
//   s >= T:      m (constant: lr)
// so with m = 0 no step of the run has a zero rate, and the decay reaches 0 one step after the last.
#include "config/config.hpp"

#include <cstdint>

namespace pf {

struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  LrDecay decay = LrDecay::Poly;
  double power = 0.5;  // poly's
  double min_lr = 0;

  double at(int64_t step) const;
};

// From optim.lr, optim.warmup_steps, optim.schedule, optim.decay_power, optim.min_lr and the run's
// length in steps.
LrSchedule make_lr_schedule(const OptimConfig& cfg, int64_t total_steps);

}  // namespace pf
