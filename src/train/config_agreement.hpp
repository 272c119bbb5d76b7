#pragma once
// Every rank of a job runs one configuration. Under mpirun each rank parses its own command line,
// and with the MPMD syntax (`mpirun -np 1 prog --set optim.lr=1e-3 : -np 1 prog --set
// optim.lr=2e-3`) those differ: ranks would train silently differently, or fail far from the cause.
#include "config/config.hpp"
#include "train/train_loop.hpp"

#include <string>

namespace pf {

// The text ranks compare: the run's flags that change what it computes or writes (--init, --save,
// --resume, --profile-dir, --overwrite), one `--flag = value` line each, then the resolved
// configuration as config.toml prints it.
std::string canonical_run_text(const Config& cfg, const TrainRunArgs& args);

// Collective over MPI_COMM_WORLD, called at start-up before anything is written: every rank
// hashes its canonical text, rank 0's hash is broadcast, the ranks whose hash differs send their
// text to rank 0, which names the first differing key against the lowest such rank. Then every
// rank throws UsageError("<key>: <value> on rank 0 but <value> on rank R: ...; ranks R, ... differ
// from rank 0").
void require_one_configuration(const Config& cfg, const TrainRunArgs& args, int world_rank);

}  // namespace pf
