#include "comm/wait.hpp"

#include "comm/rank_monitor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace pf::comm {
namespace {

std::atomic<double> g_timeout{20.0};
std::atomic<long> g_max_sleep_ns{250'000};

using Clock = std::chrono::steady_clock;

// The world rank of `peer` of `comm`, or -1.
int to_world(MPI_Comm comm, int peer) {
  if (peer < 0 || comm == MPI_COMM_NULL) return -1;
  MPI_Group g, wg;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  int out = -1;
  MPI_Group_translate_ranks(g, 1, &peer, wg, &out);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return out;
}

// The world ranks of comm's members, "0,2,3".
std::string members(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(to_world(comm, i));
  }
  return s;
}

[[noreturn]] void stalled(const WaitSite& site, double seconds) {
  int q = to_world(site.comm, site.peer);
  std::string msg =
      q >= 0 ? fmt::format("rank {}: no progress from rank {} for {:.0f} s (peer lost or stopped?) waiting for {}",
                           world_rank(), q, seconds, site.what)
             : fmt::format("rank {}: no progress from ranks {{{}}} for {:.0f} s (peer lost or stopped?) waiting for {}",
                           world_rank(), members(site.comm), seconds, site.what);
  abort_job(msg + stopped_peers_note());
}

// The backoff loop shared by every wait: `poll` returns true when everything is done and
// `*progressed` when something completed during the call (restarting the watchdog clock).
template <typename Poll>
void backoff_loop(const WaitSite& site, bool sleep, Poll&& poll) {
  bool progressed = false;
  if (poll(&progressed)) return;
  const double timeout = progress_timeout();
  auto last = Clock::now(), prev = last;
  const long max_sleep = g_max_sleep_ns.load();
  long sleep_ns = std::min(20'000L, max_sleep);
  for (;;) {
    if (sleep) {
      timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(sleep_ns * 2, max_sleep);
    }
    progressed = false;
    if (poll(&progressed)) return;
    auto now = Clock::now();
    // A pass of this loop takes microseconds: one that took seconds means this rank itself was
    // stopped (SIGSTOP, a debugger) or starved, and that time is not its peers' silence.
    if (now - prev > std::chrono::seconds(1)) last += now - prev;
    prev = now;
    if (progressed) {
      last = now;
      sleep_ns = std::min(20'000L, max_sleep);
    } else if (timeout > 0) {
      double idle = std::chrono::duration<double>(now - last).count();
      if (idle > timeout) stalled(site, idle);
    }
  }
}

}  // namespace

double progress_timeout() { return g_timeout.load(); }
void set_progress_timeout(double seconds) { g_timeout.store(seconds); }
long max_sleep_ns() { return g_max_sleep_ns.load(); }
void set_max_sleep_ns(long ns) { g_max_sleep_ns.store(std::max(1000L, ns)); }

int world_rank() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  mark_reported();  // the neighbours that see this rank go do not blame it
  // Give mpirun a moment to forward the message before MPI_Abort tears the job's I/O down.
  timespec ts{0, 200'000'000};
  nanosleep(&ts, nullptr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  abort_job(fmt::format("rank {}: MPI error in {}: {}", world_rank(), what, std::string(text, len)));
}

void wait(MPI_Request& req, const WaitSite& site, MPI_Status* status) {
  backoff_loop(site, true, [&](bool*) {
    int done = 0;
    check(MPI_Test(&req, &done, status ? status : MPI_STATUS_IGNORE), site.what);
    return done != 0;
  });
}

void wait_spin(MPI_Request& req, const WaitSite& site, MPI_Status* status) {
  backoff_loop(site, false, [&](bool*) {
    int done = 0;
    check(MPI_Test(&req, &done, status ? status : MPI_STATUS_IGNORE), site.what);
    return done != 0;
  });
}

void wait_all(std::span<MPI_Request> reqs, const WaitSite& site) {
  backoff_loop(site, true, [&](bool* progressed) {
    // MPI_Testany until nothing more completes: no allocation, and every completion counts.
    for (;;) {
      int idx = MPI_UNDEFINED, flag = 0;
      check(MPI_Testany(static_cast<int>(reqs.size()), reqs.data(), &idx, &flag, MPI_STATUS_IGNORE),
            site.what);
      if (flag && idx == MPI_UNDEFINED) return true;  // no active request left
      if (!flag) return false;
      *progressed = true;
    }
  });
}

}  // namespace pf::comm
