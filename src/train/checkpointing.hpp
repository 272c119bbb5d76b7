#pragma once
// What a training process saves in a checkpoint (io/checkpoint.hpp) and restores on resume, for
// the training loop (train/train_loop.hpp) of one process and of MPI.
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
#include "io/checkpoint.hpp"
#include "kfac/preconditioner.hpp"
#include "optim/optimizer.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace pf {

class KfacReplay;

// One process's share of the training state (one stage, or the whole model).
struct TrainState {
  std::vector<Param*> params;         // mirrors included (they load like their owner)
  Optimizer* optim = nullptr;
  KfacPreconditioner* kfac = nullptr;  // null without K-FAC
  KfacReplay* kfac_replay = nullptr;   // kfac.placement = replay: the factors it keeps
};

// The run facts a manifest records for a checkpoint after `step` steps.
std::map<std::string, std::string> checkpoint_info(const Config& cfg, int64_t step, const std::string& layout);
// Refuses (UsageError naming the key) a configuration whose model, seeds, batch or optimizer differ
// from those the checkpoint was written with: the resumed run would not continue the same one.
void check_resume(const Config& cfg, const CheckpointManifest& m);
// K-FAC's state (factors, inverses, a PipeFisher cycle and plan) belongs to the layout that wrote
// it, one process being a layout too: with kfac.enabled a checkpoint of another layout (the
// manifest's "layout", TrainEngine::layout_name) is refused, naming --init DIR for its weights.
void check_kfac_layout(const Config& cfg, const CheckpointManifest& m, const std::string& layout, const std::string& dir);
// A resumed run continues the checkpoint's learning-rate schedule (recorded as lr_decay_steps):
// with a smaller train.steps it stops early on that schedule (cfg.optim.decay_steps is set to it);
// a larger one extends the run, the rate following the schedule of a train.steps-step run from
// the checkpoint's step (that schedule reached 0 at its run's end); optim.decay_steps, if set,
// chooses the schedule. Returns a line for the user when the schedule or the length differs.
std::string keep_lr_schedule(Config& cfg, const CheckpointManifest& m);
// `--resume DIR` (`what`: the flag, or train.checkpoint_dir when a run continues on its own,
// train/train_loop.hpp): the newest complete checkpoint of DIR, verified, checked against the
// configuration (check_resume, check_weights_fit, steps left, keep_lr_schedule, which may set
// cfg.optim.decay_steps). A checkpoint at train.steps is accepted when it ends the run that wrote
// it (its manifest's train.steps): that run stopped before its final outputs, which the resumed
// run writes.
// `notes` gets lines for the user: newer checkpoints passed over (corrupt, incomplete) and the
// schedule kept.
std::unique_ptr<CheckpointReader> open_resume_checkpoint(Config& cfg, const std::string& dir, const std::string& what,
                                                         std::vector<std::string>& notes);
// `--init` and `--resume` as given to `pipefisher train`: init may be a safetensors file or a
// checkpoint directory (its newest complete checkpoint, or a step directory itself, verified,
// returned; weights by name, whatever layout wrote it); a missing path, or both flags, is a
// UsageError naming the flag. The weights are checked against `model` (check_weights_fit) now,
// before anything is written. Null when init is empty or a file.
std::unique_ptr<CheckpointReader> open_init_checkpoint(const std::string& init, const std::string& resume,
                                                       const ModelConfig& model);
// The first check of open_init_checkpoint: UsageError naming --init unless init is a file or a directory.
void require_init_path(const std::string& init);

// Weights for the whole model that `model` configures, checked as a load checks them without
// keeping the model (it is built a block at a time): every parameter present, of its shape, finite.
// `ckpt`: a checkpoint (its weights files must hold no tensor the model lacks, a 2-layer checkpoint
// for a 1-layer model; its weights and state files no NaN or Inf); null: the safetensors file
// `file` (a hub file may hold more: load_init_weights names it). UsageError naming the file and the
// first tensor at fault.
void check_weights_fit(const ModelConfig& model, const std::string& file, const CheckpointReader* ckpt);

// Loads `--init` weights into params by name: from a safetensors file, or from the newest complete
// checkpoint of a directory (`ckpt`, as open_init_checkpoint returned it; null for a file). A file
// may use the hub's layouts (io/hf_model.hpp); its tensors the model does not use are named on stderr.
void load_init_weights(const std::string& init, const CheckpointReader* ckpt, const std::vector<Param*>& params);

// A training run's outputs never hold NaN or Inf: a diverged run's tensors (an absurd optim.lr)
// are refused, UsageError naming the file and tensor, before anything of the file is written.
void require_finite(std::span<const float> values, const std::string& tensor, const std::string& path);
void require_finite(const std::vector<const Param*>& params, const std::string& path);
// save_safetensors of the trained weights to --save `path` (a path the user names: a device there
// is written in place), after require_finite on each.
void save_trained_weights(const std::string& path, const std::vector<const Param*>& params);
// Writes weights-stage-S and state-stage-S into step_dir (require_finite first); returns the two files.
std::vector<CheckpointFile> write_stage_state(const std::string& step_dir, int stage, const TrainState& st);
// Restores parameters, optimizer state and step count, and K-FAC state, by name.
void load_train_state(const CheckpointReader& r, const TrainState& st);

// train.checkpoint_every > 0: the run writes checkpoints (0: none at all, also on a stop signal).
bool checkpoints_on(const Config& cfg);
// The directory checkpoints go to: train.checkpoint_dir, or out_dir/checkpoints when that is empty.
std::string checkpoint_dir_of(const Config& cfg);
// "the last complete checkpoint is DIR/step-000012: continue with --resume DIR", or "no complete
// checkpoint in DIR", from DIR/latest (not verified: for messages when a run stops).
std::string last_checkpoint_note(const std::string& dir);

}  // namespace pf
