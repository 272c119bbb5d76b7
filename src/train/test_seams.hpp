#pragma once
// Faults the tests inject into a training run (tests/faults), through `pipefisher train`'s hidden
// flags --test-poison and --test-signal, K-FAC's planning fixed (--test-*), and the benchmarks'
// noise (--bench-*). They reach the loop and the engines as options: the signal is the loop's, the
// rest are the seams the engines own (runtime/seams.hpp). A real run leaves them empty, and
// nothing is read from the environment.
#include "runtime/seams.hpp"

#include <cstdint>
#include <string>

namespace pf {

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
// --test-drift-at, --test-kfac-cost-scale, --test-bcast-model ("" each: none), --test-fixed-costs.
KfacSeams parse_kfac_flags(const std::string& drift_at, const std::string& cost_scale, const std::string& bcast_model,
                           bool fixed_costs = false);
// --bench-slow, --bench-jitter ("" each: none).
NoiseSeam parse_noise_flags(const std::string& slow, const std::string& jitter);

}  // namespace pf
