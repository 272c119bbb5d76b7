#pragma once
// The MPI world and its process groups.
//
// Layout: P = D x W ranks, D pipeline stages ("devices" of one pipeline) times W data-parallel
// replicas. World rank r holds stage s = r % D of replica w = r / D, i.e. r = w*D + s: a pipeline
// is D consecutive ranks, so with ranks filled host by host (mpirun's default) the activation
// traffic stays on a host and only the gradient all-reduce crosses hosts.
//
// Every rank belongs to (MPI_Comm_split of the world):
//   pipeline       the D ranks of its replica w, ordered by stage (rank in it = s);
//   data_parallel  the W ranks holding its stage s, ordered by replica (rank in it = w);
//   stage_holders  for Chimera, where device i hosts the down-pipeline's stage i and the
//                  up-pipeline's stage D-1-i: every device holding a copy of stage i, i.e. devices
//                  i and D-1-i of every replica (2W ranks; W when i = D-1-i). Both stages a device
//                  hosts have the same holders: stage_holders sums stage min(i, D-1-i) and its
//                  duplicate mirror_holders sums the other. Two communicators because non-blocking collectives on one communicator must be posted in the same order
//                  by every member, and devices i and D-1-i finish their two stages' backward in
//                  opposite orders, so each stage gets its own communicator (holders_comm(s)).
//
// In general, streams of collectives whose order may differ between members (gradients vs
// K-FAC factors posted from different points of the schedule) need separate communicators:
// Comm::dup() one per stream.
#include <mpi.h>

#include <vector>

namespace pf::comm {

// Initialises MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI; OpenBLAS/OpenMP threads
// never do) and finalises it when destroyed. MPI_COMM_WORLD gets MPI_ERRORS_RETURN (errors
// become messages, see wait.hpp) and the watchdog reads PF_COMM_TIMEOUT. If MPI was already
// initialised, World neither initialises nor finalises it.
class World {
 public:
  World(int* argc, char*** argv);
  World() : World(nullptr, nullptr) {}
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return MPI_COMM_WORLD; }

 private:
  int rank_ = 0;
  int size_ = 1;
  bool owns_ = false;
  int exceptions_at_init_ = 0;
};

// An owned communicator, freed on destruction.
class Comm {
 public:
  Comm() = default;
  explicit Comm(MPI_Comm c) : c_(c) {}
  ~Comm();
  Comm(Comm&& o) noexcept : c_(o.c_) { o.c_ = MPI_COMM_NULL; }
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  MPI_Comm get() const { return c_; }
  operator MPI_Comm() const { return c_; }
  int rank() const;
  int size() const;
  Comm dup() const;  // same members, separate message space (collective)

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

struct Groups {
  int stages = 1;    // D
  int replicas = 1;  // W
  int rank = 0;      // world rank
  int stage = 0;     // s = rank % D
  int replica = 0;   // w = rank / D
  Comm pipeline;
  Comm data_parallel;
  Comm stage_holders;   // sums stage min(stage, D-1-stage)
  Comm mirror_holders;  // sums stage max(stage, D-1-stage); same members, its own ordering

  // Chimera: the communicator summing stage s, one of the two stages this device hosts.
  MPI_Comm holders_comm(int s) const;

  // World rank of stage s of replica w.
  int world_rank(int s, int w) const { return w * stages + s; }
  // Chimera: the device (pipeline position) hosting the other pipeline's copy of stage s.
  int mirror_stage(int s) const { return stages - 1 - s; }
  // World ranks holding a copy of stage s under Chimera (the members of that stage_holders
  // communicator, in its rank order: replica-major, then the lower of devices s, D-1-s first).
  std::vector<int> holders(int s) const;
};

// Splits the world into the groups of a D x W layout. Throws UsageError (naming
// parallel.stages and parallel.data_parallel) when the world size is not D*W. Collective.
Groups make_groups(const World& world, int stages, int data_parallel);

}  // namespace pf::comm
