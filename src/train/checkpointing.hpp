#pragma once
// What a training process saves in a checkpoint (io/checkpoint.hpp) and restores on resume, plus
// the run's stop signals and the numerical-fault test hook. Shared by the single-process loop
// (apps/cmd_train.cpp) and the MPI loop (runtime/train_run.cpp).
//
// Per stage: weights-stage-S.safetensors holds its parameter values in Hugging Face's names and
// layouts, as model.safetensors does (mirrors left out: their owner's file has them) and
// state-stage-S.safetensors its optimizer state ("<param>.exp_avg", ...)
// and K-FAC state ("<layer>.kfac.A", "_inv", "_counters": factors, inverses and the refresh
// counters), with the optimizer's step count in the metadata. Everything else a step depends on is a
// pure function of the step number and the configuration: the data position (sequence
// step * global batch, data/batches.hpp), dropout's random numbers (Model::set_dropout_step(seed,
// step)) and K-FAC's refresh pattern (curvature_step(step)). The manifest records those facts,
// and a resume refuses a configuration that disagrees with them.
#include "config/config.hpp"
#include "core/micro_batch.hpp"
#include "io/checkpoint.hpp"
#include "kfac/preconditioner.hpp"
#include "optim/optimizer.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pf {

// One process's share of the training state (one stage, or the whole model).
struct TrainState {
  std::vector<Param*> params;         // mirrors included (they load like their owner)
  Optimizer* optim = nullptr;
  KfacPreconditioner* kfac = nullptr;  // null without K-FAC
};

// The run facts a manifest records for a checkpoint after `step` steps.
std::map<std::string, std::string> checkpoint_info(const Config& cfg, int64_t step, const std::string& layout);
// Refuses (UsageError naming the key) a configuration whose seeds, batch or optimizer differ from
// those the checkpoint was written with: the resumed run would not continue the same one.
void check_resume(const Config& cfg, const CheckpointManifest& m);
// `--init` and `--resume` as given to `pipefisher train`: init may be a safetensors file or a
// checkpoint directory (its newest complete checkpoint, verified, returned; weights by name,
// whatever layout wrote it); a missing path, or both flags, is a UsageError naming the flag.
// Null when init is empty or a file.
std::unique_ptr<CheckpointReader> open_init_checkpoint(const std::string& init, const std::string& resume);

// Loads `--init` weights into params by name: from a safetensors file, or from the newest complete
// checkpoint of a directory (`ckpt`, as open_init_checkpoint returned it; null for a file). A file
// may use the hub's layouts (io/hf_model.hpp); its tensors the model does not use are named on stderr.
void load_init_weights(const std::string& init, const CheckpointReader* ckpt, const std::vector<Param*>& params);

// Writes weights-stage-S and state-stage-S into step_dir; returns the two files.
std::vector<CheckpointFile> write_stage_state(const std::string& step_dir, int stage, const TrainState& st);
// Restores parameters, optimizer state and step count, and K-FAC state, by name.
void load_train_state(const CheckpointReader& r, const TrainState& st);

// The directory checkpoints go to: train.checkpoint_dir, or out_dir/checkpoints when that is empty
// (a stop signal still writes one).
std::string checkpoint_dir_of(const Config& cfg);

// SIGINT / SIGTERM / SIGUSR1 set a flag the loop reads at the end of each step (a second signal
// kills). Under mpirun: mpirun forwards SIGTERM to the ranks but SIGKILLs them
// odls_base_sigkill_timeout seconds later (OpenMPI's default: 1 s), which may cut the final
// checkpoint short (the previous one stays intact); SIGUSR1 is forwarded without killing anything,
// so `kill -USR1 <mpirun pid>` always leaves time for it.
void install_stop_signals();
int stop_signal();  // the signal received, 0 if none
const char* signal_name(int sig);

// TEST HOOK (tests/faults only): when the environment sets PF_TEST_POISON_STEP=k, step k's loss
// scale becomes NaN (or +Inf with PF_TEST_POISON_KIND=inf), so its loss and every gradient are
// non-finite. Returns true when it poisoned. Never set it in a real run.
bool test_poison_step(int64_t step, std::vector<MicroBatch>& mbs);
// TEST HOOK: with PF_TEST_POISON_KIND=loss, step k's reported loss is NaN while its gradients
// stay finite (test_poison_step then leaves the micro-batches alone); true at that step.
bool test_poison_loss(int64_t step);

}  // namespace pf
