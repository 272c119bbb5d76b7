#pragma once
// `pipefisher train` under MPI: every rank runs its stages' executor; world rank 0 writes what a
// single-process run writes (config.toml, log.jsonl, model.safetensors, summary.json in
// train.out_dir, the status lines) plus the profiler's files.
#include "config/config.hpp"
#include "runtime/profiler.hpp"

#include <string>

namespace pf {

struct ParallelRunArgs {
  std::string init, save;  // --init, --save (safetensors)
  ProfileOptions profile;  // --profile-dir, --profile-steps
  std::string resume;      // --resume: a checkpoint directory
  bool log_json_from_flag = false;  // train.log_json came from --log-json (for messages)
  bool overwrite = false;           // --overwrite: another run's outputs in out_dir may go
};

// Initialises MPI (comm::World), trains, finalises. Returns the exit status. A UsageError found
// by every rank alike (configuration, layout) is thrown on world rank 0 only; the other ranks
// return 2 without printing, so the user reads one line.
int run_parallel_training(Config cfg, const ParallelRunArgs& args);

// The launcher's world, read from the environment before MPI starts (OpenMPI's
// OMPI_COMM_WORLD_SIZE / _RANK, or PMI_SIZE / PMI_RANK): 1 and 0 when not launched by mpirun.
int launcher_world_size();
int launcher_rank();
// Ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), 1 without mpirun.
int launcher_local_size();

}  // namespace pf
