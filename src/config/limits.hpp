#pragma once
// What a configuration asks of the machine, checked before anything is allocated: the memory its
// sizes imply (parameters, gradients, optimizer state, K-FAC factors and inverses, the activations
// of a micro-batch, the threads' stacks) against the memory this machine has, and its thread count
// against the machine's limits. The memory estimate is an upper bound of the run's peak resident
// memory (measured against it for several shapes by bench/memory.sh, docs/training.md), compared
// with the memory available now, so a run that starts has room; the message names the key most
// responsible and both amounts.
#include "config/config.hpp"

#include <cstdint>
#include <string>

namespace pf {

struct MachineMemory {
  double bytes = 0;    // available now: the smaller of MemAvailable and the cgroup's limit less its usage
  std::string source;  // where it was read
};
MachineMemory machine_memory();

// The limits on threads per host: memory for their stacks, and the kernel's.
struct ThreadLimits {
  double stack_bytes = 0;    // per thread: OMP_STACKSIZE, else the stack rlimit (ulimit -s)
  int64_t kernel_max = 0;    // threads-max, pid_max, RLIMIT_NPROC and vm.max_map_count / 2, the least
  std::string kernel_what;   // which of them
};
ThreadLimits thread_limits();

// The address-space limit of this process (ulimit -v) and what it has mapped so far.
struct AddressSpace {
  double limit = 0;   // RLIMIT_AS's soft limit; infinity when unlimited
  double mapped = 0;  // VmSize (/proc/self/status)
  int blas_buffers = 0;  // OpenBLAS buffers among those mappings
};
AddressSpace address_space();

// What a run will still map in this process, beyond what it has mapped when asked, by part.
struct AddressNeed {
  double run = 0;      // parameters, optimizer and K-FAC state, activations: this rank's share, with room for the peak
  int threads = 0;     // OpenMP = OpenBLAS threads the run will use
  int buffers = 0;     // OpenBLAS buffers still to be mapped (core/blas.hpp)
  double blas = 0;     // their bytes
  double stacks = 0;   // stacks of the threads still to start
  double files = 0;    // the token files, memory-mapped whole
  double total() const { return run + blas + stacks + files; }
};
AddressNeed address_need(const Config& cfg, int local_ranks, int world_ranks, const AddressSpace& now);

// Bytes the run allocates at least, on the host of a rank: the job's share of `local_ranks` of
// `world_ranks` processes (pipeline stages split the model, data-parallel replicas copy it).
double estimate_run_bytes(const Config& cfg, int local_ranks = 1, int world_ranks = 1);
// At most what those processes hold at their peak (resident memory): what the memory check compares.
double estimate_peak_bytes(const Config& cfg, int local_ranks = 1, int world_ranks = 1);

// Refuses (UsageError naming the key) a configuration whose thread count exceeds the machine's
// limits, or whose peak memory estimate exceeds the memory available; and (naming ulimit -v) one that
// would not fit this process's address-space limit. `local_ranks` processes of `world_ranks`
// share this host.
void check_resources(const Config& cfg, int local_ranks = 1, int world_ranks = 1);

// The address-space part of check_resources alone (UsageError naming ulimit -v), for commands
// that run a model without training it (eval, generate): call it before set_threads.
void check_address_space(const Config& cfg, int local_ranks = 1, int world_ranks = 1);

// "1.5 GiB", "23.4 GiB", "7.3e+03 TiB".
std::string format_bytes(double bytes);

}  // namespace pf
