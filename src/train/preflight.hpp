#pragma once
// Before the first step of a run: every path it will write is checked writable (nothing is
// written: a probe file is created and removed) and not in use, and only then are its output
// directories made and locked, so that two live runs never share one.
//
//   train.out_dir          a directory (made if missing) where config.toml, log.jsonl,
//                          model.safetensors, summary.json go: each absent or a regular file
//                          (not a directory, link or device: core/files.hpp's rule)
//   train.log_json         a file (--log-json) whose directory exists, or a device, FIFO or link
//                          (/dev/stdout), written where it is
//   --save                 the same
//   train.checkpoint_dir   a directory (made if missing; default out_dir/checkpoints) whose
//                          `latest`, if present, is a regular file; neither checked nor made
//                          without checkpoints (train.checkpoint_every = 0)
//   --profile-dir          a directory (made if missing)
// No two of these outputs may name one file, nor name an input of the run: the configuration file,
// --init's and --resume's files, the token files and their document indexes,
// parallel.schedule_file, kfac.plan_profile (compared by device and inode, by resolved path for a
// file not yet there). Two of a run's own files are read and rewritten: out_dir's config.toml as
// the configuration, and out_dir's kfac_profile.json as kfac.plan_profile.
//
// A checkpoint directory belongs to one run directory: its owner.json names that out_dir
// (relative to the checkpoint directory when inside it, so that the run directory can be moved or
// copied) and the run's id, which every manifest it writes carries. A run with another out_dir is
// refused, naming the owner, unless it resumes from that directory and the owner's out_dir is gone
// (a moved run). Retention removes only checkpoints that carry the run's id (io/checkpoint.hpp).
//
// An out_dir that exists, is not empty and is not a run directory of ours (it holds neither
// config.toml nor .pipefisher-lock: a Hugging Face model folder, a home directory) is refused,
// naming a few of its entries, unless --overwrite is given.
//
// Another run's outputs: an out_dir whose config.toml differs from this run's (Hugging Face's
// overwrite_output_dir rule) is refused, naming the first key that differs and both values, unless
// the run resumes (--resume) or --overwrite is given. The run continues (continues_its_run) when
// its config.toml differs at most in train.steps and optim.decay_steps and its checkpoint
// directory holds a checkpoint; the same config without one (the same job run again) starts over.
// --overwrite removes them before the new run writes (remove_previous_outputs), so that a new run
// stopped early is not mistaken for the old.
//
// Locks: an advisory lock (flock) on out_dir/.pipefisher-lock and on
// checkpoint_dir/.pipefisher-lock (made now, out_dir/checkpoints by default; none without
// checkpoints), held until the process exits (a killed run's lock goes with it). A second run
// finds one held and is refused, also a --resume that would write into the checkpoint directory
// of a live run. Holding them, the run removes the temporaries (NAME.tmp.PID) a killed process
// left of its own outputs there.
#include "config/config.hpp"
#include "core/files.hpp"

#include <memory>
#include <string>
#include <vector>

namespace pf {

struct RunOutputs {
  std::string save;                 // --save
  std::string profile_dir;          // --profile-dir
  bool log_json_from_flag = false;  // train.log_json came from --log-json (named so in errors)
  bool resuming = false;            // --resume: the run's own out_dir, appended to
  bool continuing = false;          // continues_its_run: the run in out_dir goes on
  bool overwrite = false;           // --overwrite: another run's outputs may be replaced
  std::string resume_dir;           // the checkpoint directory the run resumes from ("" none)
  std::vector<NamedPath> inputs;    // the configuration file, --init's and --resume's files
};

// Auto-resume (Hugging Face's resume_from_checkpoint=True, Megatron's --load): out_dir holds the
// config.toml of this configuration, but for keys that do not change what is trained (the length:
// train.steps, optim.decay_steps; how it runs and reports: train.threads, log_json, log_every,
// eval_every, checkpoint_every, keep_checkpoints; where it was written: the train.out_dir a copied
// or moved run's config.toml recorded), and the checkpoint directory a checkpoint
// (has_checkpoint: verified when opened). Reads only.
bool continues_its_run(const Config& cfg);

// UsageError naming the key or flag of the first path that cannot be written, of a directory
// another live run has locked, or of an out_dir holding another run's outputs (see above).
// Creates nothing.
void check_output_paths(const Config& cfg, const RunOutputs& outputs);

// Held locks on the run's output directories (released on destruction or exit).
class RunLocks {
 public:
  RunLocks() = default;
  ~RunLocks();
  RunLocks(const RunLocks&) = delete;
  RunLocks& operator=(const RunLocks&) = delete;
  void add(int fd) { fds_.push_back(fd); }

 private:
  std::vector<int> fds_;
};

// After check_output_paths: makes out_dir and the checkpoint directory and locks them;
// UsageError naming the key when another live process took one meanwhile (its pid and host are
// in the message).
std::unique_ptr<RunLocks> lock_output_dirs(const Config& cfg, const RunOutputs& outputs);

// After the locks: writes the checkpoint directory's owner.json (this run's out_dir, and its id:
// kept when the directory is already this run's) and returns the run's id. "" without checkpoints.
std::string claim_checkpoint_dir(const Config& cfg);

// --overwrite, after the locks: removes the files a training run writes in out_dir (an input of
// this run among them stays) and the checkpoints of out_dir/checkpoints.
void remove_previous_outputs(const Config& cfg);

}  // namespace pf
