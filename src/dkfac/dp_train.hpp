#pragma once
// `pipefisher train` with K-FAC over W data-parallel replicas of the whole model
// (parallel.stages = 1, parallel.data_parallel = W, kfac.enabled): each rank runs its replica's
// micro-batches (replica w: global micro-batches w*N .. w*N+N-1, the single-process numbering),
// the gradients are all-reduced bucket by bucket during the last backward, the K-FAC factors and
// inverses are shared as kfac.distributed says (dkfac/distributed_kfac.hpp), then every rank
// preconditions and steps the same way as the single-process Trainer, so the weights equal
// single-process K-FAC training of the same global batch up to summation order.
//
// World rank 0 writes what a single-process run writes (config.toml, log.jsonl,
// model.safetensors, summary.json) plus dkfac.json: the strategy, the fusion plan and inversion
// placement, and this run's time totals averaged over ranks (factor all-reduces in flight and
// waited for, inversion and broadcast waits), for bench/spd_kfac.
#include "comm/world.hpp"
#include "config/config.hpp"

#include <string>

namespace pf {

struct DpKfacArgs {
  std::string init, save;   // --init, --save (safetensors)
  std::string perf_cache;   // perf-model cache directory ("" = comm::perf_cache_dir())
  std::string profile_dir;  // --profile-dir: not supported by this loop (refused)
  bool overwrite = false;   // --overwrite: another run's outputs in out_dir may go
};

// True when the run is this loop's: one stage, K-FAC on.
bool is_dp_kfac_run(const Config& cfg);
// Trains; returns the exit status. UsageErrors are thrown on every rank alike.
int run_dp_kfac_training(const comm::World& world, Config cfg, const DpKfacArgs& args);

}  // namespace pf
