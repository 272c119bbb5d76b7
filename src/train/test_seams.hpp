#pragma once
// Faults the tests inject into a training run (tests/faults), through `pipefisher train`'s hidden
// flags --test-poison and --test-signal, and the benchmarks' noise (--bench-*). They reach the
// loop and the engines as options; a real run leaves them empty, and nothing is read from the
// environment.
#include "core/micro_batch.hpp"

#include <cstdint>
#include <optional>
#include <utility>
#include <string>
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

// --test-signal SIG@WHERE: the process raises SIG (TERM, INT, USR1 or KILL) to itself at one
// moment of the run, as if it had arrived just then:
//   step:N        as step N (from 1) starts
//   eval:N        as the evaluation after step N starts
//   final-writes  after model.safetensors is written, before the rest of the final outputs
// Under MPI every rank raises it at steps and evaluations, as mpirun forwards a signal to every
// rank; only world rank 0 writes, so only it raises at the final writes.
struct SignalSeam {
  enum class Where { none, step, eval, final_writes };
  Where where = Where::none;
  int64_t step = 0;
  int signal = 0;

  // Raises the signal when (w, step_number) is the chosen moment.
  void at(Where w, int64_t step_number = 0) const;
};

// K-FAC's planning in the MPI runtime (runtime/pipefisher/controller.hpp), fixed so that a test knows
// what the planner will decide whatever the machine's load:
//   --test-drift-at STEP        steps STEP..STEP+2 (from 1) count as 10x their forward/backward time
//   --test-kfac-cost-scale X[,Y]  the planner sees the measured K-FAC unit costs times X; with Y,
//                               adaptive's re-plans from the measured steps see them times Y
//   --test-bcast-model A,B      a broadcast costs A ms + B ms per byte (not the measured model)
struct KfacSeams {
  int64_t drift_at_step = 0;  // 0: none
  double cost_scale = 1;
  std::optional<double> adapt_cost_scale;  // none: cost_scale
  std::optional<std::pair<double, double>> bcast_model;

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

struct TestSeams {
  PoisonStep poison;
  SignalSeam signal;
  KfacSeams kfac;
  // --test-oom-counter FILE: the ranks' monitor reads the kernel's out-of-memory kill count from
  // FILE ("oom_kill N") instead of /proc/vmstat (comm/rank_monitor.hpp), so a test can raise it.
  std::string oom_counter;
  NoiseSeam noise;
};

// The flags' values, parsed; a malformed one is a UsageError naming the flag. "" gives none.
PoisonStep parse_poison_flag(const std::string& value);
SignalSeam parse_signal_flag(const std::string& value);
// --test-drift-at, --test-kfac-cost-scale, --test-bcast-model ("" each: none).
KfacSeams parse_kfac_flags(const std::string& drift_at, const std::string& cost_scale, const std::string& bcast_model);
// --bench-slow, --bench-jitter ("" each: none).
NoiseSeam parse_noise_flags(const std::string& slow, const std::string& jitter);

}  // namespace pf
