#pragma once
// `pipefisher train`'s training loop, one for a single process and for MPI alike (the engine,
// train/train_engine.hpp, holds the model and does the work), in phases:
//
//   set-up      every check that can refuse the run comes first: the files, --init and --resume
//               (verified, and their tensors loaded into the model, so a shape that differs is
//               refused here), the output paths and their locks. Only then the run writes: the
//               locks, --overwrite's removal of the previous run's outputs, config.toml, the logs.
//               --dry-run is this phase up to its first write (TrainRunArgs::dry_run), so that it
//               refuses exactly what the run refuses, with the same line.
//   step        one optimizer step. A non-finite loss or gradient norm changed nothing: the step
//               is skipped, or the run stops with status 1 (train.on_nonfinite = stop).
//   evaluate    after every train.eval_every steps and after the last step. A validation loss
//               that is not finite means the weights diverged: the run stops with status 1,
//               writing neither that state's checkpoint nor its model.
//   checkpoint  after every train.checkpoint_every steps and after the last step, and when the
//               run stops on a signal, into train.checkpoint_dir (default out_dir/checkpoints);
//               train.checkpoint_every = 0: none at all, which the run says.
//   stop        SIGINT, SIGTERM and SIGUSR1 set a flag read at the end of each step; the
//               processes agree to stop after the step in which any saw one, write a checkpoint
//               and exit 128 + signal. A second signal kills.
//   finish      model.safetensors, config.json, --save, the engine's records, summary.json last
//               (a run holding summary.json is complete).
//
// Auto-resume: without --resume or --overwrite, a run whose out_dir holds its own config.toml (a
// changed train.steps or optim.decay_steps allowed) and a checkpoint continues from the newest
// complete one, as --resume of its checkpoint directory does: the same command run again
// finishes a stopped run, or extends a finished one with a larger train.steps.
// A run stopped at any point finishes with --resume: a checkpoint at the end of its run (the stop
// came during the last step or the final evaluation, or a kill during the final writes) resumes
// into the finish phase, which evaluates and writes the same files an uninterrupted run ends with.
// A signal that arrives once the last step's checkpoint decision is made lets the final writes
// complete (status 0).
//
// Under mpirun: mpirun forwards SIGTERM to the ranks but SIGKILLs them odls_base_sigkill_timeout
// seconds later (OpenMPI's default: 1 s), which may cut the final checkpoint short (the previous
// one stays intact); SIGUSR1 is forwarded without killing anything, so `kill -USR1 <mpirun pid>`
// always leaves time for it.
#include "config/config.hpp"
#include "core/files.hpp"
#include "train/test_seams.hpp"
#include "train/train_engine.hpp"

#include <functional>
#include <string>

namespace pf {

struct TrainRunArgs {
  std::string init, save, resume;   // --init, --save, --resume
  NamedPath config;                 // the configuration file read ("" the defaults) and what names it
  std::string profile_dir;          // --profile-dir: checked writable here, written by the engine
  bool log_json_from_flag = false;  // train.log_json came from --log-json (named so in errors)
  bool overwrite = false;           // --overwrite: another run's outputs in out_dir are removed
  TestSeams seams;                  // tests only (hidden flags)
  // --dry-run: the run's own set-up, every check through the same code, then this report on the
  // root (its exit status) instead of the first write. Null: the run itself.
  std::function<int(const Config&)> dry_run;
};

// Runs the training of `cfg` on `engine`; returns the exit status: 0, 1 (a non-finite step with
// train.on_nonfinite = stop, or a diverged run: a non-finite validation loss) or 128 + signal (stopped, checkpoint written). Throws UsageError for
// a refusal (before anything is written) or a write error (naming the last complete checkpoint).
int run_training(TrainEngine& engine, Config cfg, const TrainRunArgs& args);

}  // namespace pf
