#pragma once
// A dying rank, in pipefisher's own words. Under mpirun a rank that is SIGKILLed or crashes ends
// the job through mpirun, whose banner names the rank but not the run; RankMonitor adds one line:
//
//   pipefisher: rank 1 (pid 4242) died during step 15; the last complete checkpoint is
//   DIR/step-000010: continue with --resume DIR
//
// Who says it:
//   - a rank that crashes (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) says it itself, from its
//     signal handler, then dies of the signal as before;
//   - a rank that cannot speak (SIGKILL, the OOM killer) is seen by the ranks on its host, which
//     watch their neighbours' pids (a background thread, every 50 ms; it never calls MPI): the
//     lowest-ranked survivor there says it, with the signal when it can tell: "was killed during
//     step 15 (signal 9, likely out of memory: ...)" when the kernel's out-of-memory killer ran
//     since the run began (oom_kill of /proc/vmstat), "was killed by signal N" when it caught the
//     rank's exit code before mpirun's daemon reaped it. A rank alone on its host is left to
//     mpirun's banner;
//   - a rank that ends the job itself (abort_job: the watchdog naming a lost or stopped peer, an
//     MPI error) has said why: its neighbours say nothing more (mark_reported).
// Only deaths while steps run are reported (StepsRunning), not ranks leaving at the end of a run
// or after an error they all found.
#include "comm/world.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pf::comm {

class RankMonitor {
 public:
  // Collective over MPI_COMM_WORLD (an all-gather of pids and host identities). `checkpoint_note`
  // says where the last complete checkpoint is ("the last complete checkpoint is ..."); it is
  // called when a step starts running and after each checkpoint (see checkpoint_written).
  // `oom_counter`: the file where the kernel counts its out-of-memory kills ("oom_kill N"; tests
  // give a file of their own, train/test_seams.hpp).
  RankMonitor(const World& world, std::function<std::string()> checkpoint_note,
              const std::string& oom_counter = "/proc/vmstat");
  ~RankMonitor();
  RankMonitor(const RankMonitor&) = delete;
  RankMonitor& operator=(const RankMonitor&) = delete;

 private:
  struct Peer {
    int rank = 0;
    int pid = 0;
    bool local = false;  // same host (boot id) and pid namespace as this rank
  };
  void watch();
  void report(const Peer& p, int signal) const;
  std::vector<Peer> peers_;
  std::string oom_counter_;
  int64_t oom_kills_at_start_ = -1;
  int rank_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Marks the steps of the training loop as running for the monitor's reports while in scope (a
// death after the loop, or during the unwinding of an error every rank found, is not reported).
class StepsRunning {
 public:
  StepsRunning();
  ~StepsRunning();
  StepsRunning(const StepsRunning&) = delete;
  StepsRunning& operator=(const StepsRunning&) = delete;
};

// The step now running, from 0 (messages say step + 1, as the logs do).
void monitor_step(int64_t step);
// A checkpoint was completed: refreshes the note a report carries.
void checkpoint_written();
// This rank has said why it ends the job (comm/wait.hpp's abort_job): its neighbours stay quiet.
void mark_reported();
// "; rank 1 (pid 4242) is stopped (SIGSTOP or a debugger)" for each rank on this host that is
// stopped now, for the watchdog's message ("" when none, or no monitor lives).
std::string stopped_peers_note();

}  // namespace pf::comm
