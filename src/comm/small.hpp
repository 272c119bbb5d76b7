#pragma once
// Small collectives the runtime needs besides the gradient buckets: a sum of a few doubles
// (loss, squared norms), a gather of byte strings to one rank (the profiler's records) and a
// barrier. All are non-blocking MPI calls finished by comm::wait, so a rank waiting in them
// sleeps instead of spinning and is covered by the watchdog.
#include <mpi.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pf::comm {

// In-place sum over comm; every member gets the result.
void allreduce_sum(std::span<double> values, MPI_Comm comm, const char* what = "all-reduce of scalars");
// Every member's bytes, in rank order, at `root` (empty elsewhere).
std::vector<std::string> gather_bytes(const std::string& mine, int root, MPI_Comm comm);
void barrier(MPI_Comm comm, const char* what = "barrier");
// A barrier that gives up after `seconds`: whether every member reached it in time. For ranks
// that end a job together (a refusal), so that none exits before rank 0 has said why; outside
// the watchdog, and its request is left behind when it gives up (the process is ending).
bool barrier_within(MPI_Comm comm, double seconds);

// Runs `fn` on world rank 0 only; a UsageError it throws is thrown on every rank (rank 0's
// message travels by broadcast), so no rank is left waiting in a collective.
void on_root_agreed(int world_rank, const std::function<void()>& fn);

// Threads per rank: `configured` when > 0, else the cores shared among the ranks on this host.
int threads_per_rank(int configured);

}  // namespace pf::comm
