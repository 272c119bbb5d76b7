#pragma once
// `pipefisher train` under MPI: the training loop (train/train_loop.hpp) with every rank running
// its stages' executor (src/runtime: the layer below, which includes nothing of train); world
// rank 0 writes what a single-process run writes (config.toml, log.jsonl, model.safetensors,
// summary.json in train.out_dir, the status lines) plus activations.json, the K-FAC records and
// the profiler's files.
#include "config/config.hpp"
#include "train/train_loop.hpp"

#include <set>
#include <string>

namespace pf {

// Initialises MPI (comm::World), trains, finalises. Returns the exit status. A UsageError found
// by every rank alike (configuration, layout) is thrown on world rank 0 only; the other ranks
// return 2 without printing, so the user reads one line. `profile_steps`: --profile-steps (from
// 1; empty: every step but the first), with args.profile_dir.
int run_parallel_training(Config cfg, const TrainRunArgs& args, std::set<int> profile_steps);

// The launcher's world, read from the environment before MPI starts (OpenMPI's
// OMPI_COMM_WORLD_SIZE / _RANK, or PMI_SIZE / PMI_RANK): 1 and 0 when not launched by mpirun.
int launcher_world_size();
int launcher_rank();
// Ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS), 1 without mpirun.
int launcher_local_size();

}  // namespace pf
