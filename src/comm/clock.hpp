#pragma once
// Clock offsets between ranks, for the profiler: each rank stamps actions with its own
// std::chrono::steady_clock, and the timelines are merged on rank 0's clock.
//
// Rank 0 ping-pongs with each other rank in turn; a round trip gives rank k's clock t_k read
// between rank 0's send time t0 and receive time t1, so offset ~ t_k - (t0 + t1)/2 with an error
// of at most (t1 - t0)/2. The sample with the smallest round trip is kept. These waits poll
// without sleeping (a sleep would inflate the round trip); rounds x (P-1) round trips take well
// under a millisecond each on one host.
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace pf::comm {

struct ClockOffsets {
  std::vector<int64_t> offset_ns;  // [rank] = rank's steady_clock - rank 0's, in ns (offset_ns[0] = 0)
  std::vector<int64_t> rtt_ns;     // [rank] = the round trip of the kept sample (its error bound x 2)
};

// Collective over comm; every rank gets the result. rounds: ping-pongs per rank.
ClockOffsets estimate_clock_offsets(MPI_Comm comm, int rounds = 32);

// steady_clock now, in ns.
int64_t steady_now_ns();

}  // namespace pf::comm
