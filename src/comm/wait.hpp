#pragma once
// Waiting without spinning, and the watchdog.
//
// Ranks here share few cores (4 ranks on 2 cores is normal), so a rank blocked in MPI_Wait or
// MPI_Recv, which OpenMPI implements as a busy poll, would steal a core from a rank that computes
// (measured: 2x slower, docs/platform.md). Every wait of this layer is instead MPI_Test plus a
// nanosleep whose length doubles from 20 us up to a cap, 250 us by default. Measured with the
// worker's latency mode (2 ranks, 2 busy cores, 40 waits): cap 1 ms -> a message that arrives
// after a 2-50 ms wait is noticed ~500-640 us late on average, 1-2% CPU while waiting; cap 250 us
// -> ~80-160 us late, 2-3% CPU. Pipeline steps wait many times per step, so latency wins.
//
// The same loop is the watchdog: a wait that sees no request complete for progress_timeout()
// seconds prints "rank R: no progress from rank Q for N s (peer lost or stopped?)" and calls MPI_Abort, so a
// lost peer ends the whole job with a message instead of a hang. (Under mpirun a SIGKILLed rank is
// normally noticed by OpenMPI itself, which aborts the job within ~2 s; the watchdog covers
// what it misses: a hung peer, a lost host, a mismatched schedule.)
#include <mpi.h>

#include <span>
#include <string>

namespace pf::comm {

// What a wait is waiting for, for the watchdog's message. `peer` is a rank of `comm`
// (translated to a world rank in the message); -1 means "some member of comm" (collectives).
struct WaitSite {
  const char* what = "message";
  MPI_Comm comm = MPI_COMM_WORLD;
  int peer = -1;
};

// Seconds a wait may go without any request completing before the job is aborted. Default 20,
// or the environment variable PF_COMM_TIMEOUT (seconds) read by World; <= 0 disables it.
double progress_timeout();
void set_progress_timeout(double seconds);

// The backoff's longest sleep (default 250 us, or PF_COMM_SLEEP_US read by World): the most a
// long wait adds to a message's latency (about half of it on average) against the CPU a waiting
// rank burns waking up (see the latency mode of tests/comm/worker).
long max_sleep_ns();
void set_max_sleep_ns(long ns);

// Blocks until `req` completes (MPI_REQUEST_NULL returns at once); fills *status if given.
void wait(MPI_Request& req, const WaitSite& site, MPI_Status* status = nullptr);
// Blocks until every request completes; the watchdog clock restarts whenever one completes.
void wait_all(std::span<MPI_Request> reqs, const WaitSite& site);
// Polls with MPI_Test and no sleep, for latency measurements only (clock offsets): still bounded
// by the watchdog.
void wait_spin(MPI_Request& req, const WaitSite& site, MPI_Status* status = nullptr);

// Turns a failed MPI call (communicators use MPI_ERRORS_RETURN) into a message naming the
// operation, then aborts the job: an MPI error mid-training leaves nothing to recover.
void check(int rc, const char* what);
[[noreturn]] void abort_job(const std::string& message, int code = 1);

// This process's rank in MPI_COMM_WORLD (-1 before MPI_Init), for messages.
int world_rank();

}  // namespace pf::comm
