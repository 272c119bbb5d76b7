#pragma once
// What tests and benchmarks may inject into a run that the engines read: a step made non-finite
// (the executor and the single-process Trainer), K-FAC's planning fixed (PipeFisher's controller)
// and noise in the actions' times (the executor). `pipefisher train`'s hidden flags parse into
// them (train/test_seams.hpp); a real run leaves them empty, and nothing is read from the
// environment.
#include "core/micro_batch.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace pf {

// --test-poison STEP:KIND: step STEP (numbered from 1, as the log numbers it) turns non-finite.
//   nan, inf  every micro-batch's loss scale is NaN / +Inf: the loss and every gradient are
//   loss      only the loss is NaN (in a pipeline the last stage's ranks see it); gradients stay finite
struct PoisonStep {
  enum class Kind { nan, inf, loss };
  int64_t step = 0;  // 0: none
  Kind kind = Kind::nan;

  // Kinds nan and inf, at step index `index` (from 0): poisons the step's micro-batches.
  void poison_inputs(int64_t index, std::vector<MicroBatch>& mbs) const;
  // Kind loss at step index `index`: the step's loss is to be reported as NaN.
  bool poisons_loss(int64_t index) const { return step > 0 && kind == Kind::loss && index + 1 == step; }
};

// K-FAC's planning in the MPI runtime (runtime/pipefisher/controller.hpp), fixed so that a test knows
// what the planner will decide whatever the machine's load:
//   --test-drift-at STEP        steps STEP..STEP+2 (from 1) count as 10x their forward/backward time
//   --test-kfac-cost-scale X[,Y]  the planner sees the measured K-FAC unit costs times X; with Y,
//                               adaptive's re-plans from the measured steps see them times Y
//   --test-bcast-model A,B      a broadcast costs A ms + B ms per byte (not the measured model)
//   --test-fixed-costs          every plan (after profiling, after a re-profile) is made from
//                               with_fixed_costs of the measured profile (sim/profile.hpp; K-FAC's
//                               still times X): a machine-independent plan whose drift check still
//                               compares the measured steps
struct KfacSeams {
  int64_t drift_at_step = 0;  // 0: none
  double cost_scale = 1;
  std::optional<double> adapt_cost_scale;  // none: cost_scale
  std::optional<std::pair<double, double>> bcast_model;
  bool fixed_costs = false;

  bool drifts(int64_t index) const {  // step index from 0
    return drift_at_step > 0 && index + 1 >= drift_at_step && index + 1 < drift_at_step + 3;
  }
};

// Noise for benchmarks (`pipefisher train --bench-slow`, `--bench-jitter`; the MPI runtime only):
// timing, never the math, so a noisy run trains the same bits as a quiet one.
//   --bench-slow RANK:FACTOR[@FROM-TO]  every compute action of world rank RANK lasts FACTOR
//                                       (1 to 100) times as long in steps FROM..TO (from 1; all
//                                       steps without @): a slow or throttled rank
//   --bench-jitter FRACTION             every compute action of every rank lasts (1 + FRACTION u)
//                                       times as long (FRACTION 0 to 1), u uniform in [0, 1) from
//                                       a hash of (rank, step, action index): the same noise each run
// The extra time is slept (no CPU taken from ranks sharing a core).
struct NoiseSeam {
  int slow_rank = -1;  // -1: none
  double slow_factor = 1;
  int64_t slow_from = 1, slow_to = INT64_MAX;
  double jitter = 0;

  bool on() const { return slow_rank >= 0 || jitter > 0; }
  // Nanoseconds to add to an action of world rank `rank` that computed for `compute_ns`, the
  // `action`-th of step index `index` (from 0).
  int64_t extra_ns(int rank, int64_t index, size_t action, int64_t compute_ns) const;
};

}  // namespace pf
