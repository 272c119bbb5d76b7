#include "comm/clock.hpp"

#include "comm/wait.hpp"

#include <chrono>
#include <limits>

namespace pf::comm {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {
constexpr int kTag = 0x7ffe;  // any tag: this runs alone, before training traffic

// spin: poll without sleeping (timed rounds); otherwise sleep-wait (rank k's first receive
// waits for rank 0 to finish with ranks 1..k-1 and must not steal their cores meanwhile).
void send_i64(const int64_t* v, int peer, MPI_Comm comm, bool spin) {
  MPI_Request r;
  check(MPI_Isend(v, 1, MPI_INT64_T, peer, kTag, comm, &r), "MPI_Isend(clock)");
  WaitSite site{"a clock-sync send", comm, peer};
  spin ? wait_spin(r, site) : wait(r, site);
}
void recv_i64(int64_t* v, int peer, MPI_Comm comm, bool spin) {
  MPI_Request r;
  check(MPI_Irecv(v, 1, MPI_INT64_T, peer, kTag, comm, &r), "MPI_Irecv(clock)");
  WaitSite site{"a clock-sync message", comm, peer};
  spin ? wait_spin(r, site) : wait(r, site);
}
}  // namespace

ClockOffsets estimate_clock_offsets(MPI_Comm comm, int rounds) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ClockOffsets out;
  out.offset_ns.assign(size, 0);
  out.rtt_ns.assign(size, 0);
  for (int k = 1; k < size; ++k) {
    if (rank == 0) {
      int64_t best_rtt = std::numeric_limits<int64_t>::max(), best_off = 0;
      for (int i = 0; i <= rounds; ++i) {
        int64_t ping = i, tk = 0;
        int64_t t0 = steady_now_ns();
        send_i64(&ping, k, comm, i > 0);
        recv_i64(&tk, k, comm, i > 0);
        int64_t t1 = steady_now_ns();
        // Round 0 warms the connection up (first messages set up shared memory).
        if (i > 0 && t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          best_off = tk - (t0 + (t1 - t0) / 2);
        }
      }
      out.offset_ns[k] = best_off;
      out.rtt_ns[k] = best_rtt;
    } else if (rank == k) {
      for (int i = 0; i <= rounds; ++i) {
        int64_t ping = 0;
        recv_i64(&ping, 0, comm, i > 0);
        int64_t tk = steady_now_ns();
        send_i64(&tk, 0, comm, i > 0);
      }
    }
  }
  // Everybody learns everybody's offset.
  MPI_Request r;
  check(MPI_Ibcast(out.offset_ns.data(), size, MPI_INT64_T, 0, comm, &r), "MPI_Ibcast(clock)");
  wait(r, WaitSite{"clock offsets", comm, 0});
  check(MPI_Ibcast(out.rtt_ns.data(), size, MPI_INT64_T, 0, comm, &r), "MPI_Ibcast(clock)");
  wait(r, WaitSite{"clock offsets", comm, 0});
  return out;
}

}  // namespace pf::comm
