// `pipefisher train`: trains a model from a TOML config; with no arguments, the built-in default
// job (a short bert-mini pretraining run on the real corpus).
#include "command.hpp"
#include "config/config.hpp"
#include "config/limits.hpp"
#include "core/files.hpp"
#include "io/checkpoint.hpp"
#include "io/hf_model.hpp"
#include "io/safetensors.hpp"
#include "runtime/train_run.hpp"
#include "train/checkpointing.hpp"
#include "train/preflight.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>

namespace {

struct TrainArgs {
  std::string config, init, save, log_json, resume;
  std::vector<std::string> sets;
  int steps = 0;
  std::string profile_dir;
  std::vector<int> profile_steps;
  bool print_config = false;
  bool overwrite = false;
};

int run_train(const TrainArgs& a) {
  using namespace pf;
  std::vector<std::string> sets = a.sets;
  if (a.steps > 0) sets.push_back(fmt::format("train.steps={}", a.steps));
  Config cfg = Config::load(a.config, sets);
  if (!a.log_json.empty()) cfg.train.log_json = a.log_json;
  if (a.print_config) {
    std::fputs(cfg.to_toml().c_str(), stdout);
    return 0;
  }
  // Several ranks, a pipeline/data-parallel layout or the profiler: the MPI runtime (src/runtime).
  if (cfg.parallel.stages * cfg.parallel.data_parallel > 1 || launcher_world_size() > 1 || !a.profile_dir.empty())
    return run_parallel_training(cfg, {a.init, a.save, {a.profile_dir, {a.profile_steps.begin(), a.profile_steps.end()}},
                                       a.resume, !a.log_json.empty(), a.overwrite});
  if (!a.profile_steps.empty()) usage_error("--profile-steps", "only applies with --profile-dir");
  cfg.check_files();
  check_resources(cfg);
  std::unique_ptr<CheckpointReader> init_ckpt = open_init_checkpoint(a.init, a.resume);
  // The checkpoint to resume from, verified (checksums) before anything is written.
  std::unique_ptr<CheckpointReader> resume;
  std::vector<std::string> notes;
  if (!a.resume.empty()) resume = open_resume_checkpoint(cfg, a.resume, notes);
  const RunOutputs outputs{a.save, "", !a.log_json.empty(), !a.resume.empty(), a.overwrite};
  check_output_paths(cfg, outputs);
  // Everything that can be refused has been: from here on the run writes its outputs.
  const std::unique_ptr<RunLocks> locks = lock_output_dirs(cfg, outputs);
  for (const std::string& n : notes) std::fprintf(stderr, "pipefisher train: %s\n", n.c_str());
  Trainer trainer(cfg);
  load_init_weights(a.init, init_ckpt.get(), trainer.model().params());
  if (resume) {
    load_train_state(*resume, trainer.state());
    trainer.set_step_index(resume->manifest().step);
    std::printf("resuming from %s (step %lld)\n", resume->dir().c_str(), static_cast<long long>(resume->manifest().step));
    resume.reset();  // unmaps the files
  }
  const std::string& out = cfg.train.out_dir;
  std::unique_ptr<RunLog> log = open_run_outputs(cfg, trainer.step_index() > 0 ? trainer.step_index() : -1, cfg.kfac.enabled);

  const auto& m = cfg.model;
  std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %d heads), %lld tokens/step "
              "(%d x %d x %d sequences of %d), %s, %d steps\n",
              preset_of(m).c_str(), m.arch.c_str(), m.layers, m.hidden, m.heads,
              static_cast<long long>(trainer.tokens_per_step()), cfg.parallel.data_parallel,
              cfg.parallel.micro_batches, cfg.parallel.micro_batch_size, m.seq_len, optimizer_of(cfg).c_str(),
              cfg.train.steps);
  std::fflush(stdout);

  auto t0 = std::chrono::steady_clock::now();
  double valid = 0;
  const std::string ckpt_dir = checkpoint_dir_of(cfg);
  auto save_checkpoint = [&](int64_t steps_done) {
    const std::string step_dir = checkpoint_step_dir(ckpt_dir, steps_done);
    remove_checkpoint(step_dir);  // an interrupted earlier attempt at this step
    try {
      make_dirs(step_dir, "train.checkpoint_dir");
      CheckpointManifest m{steps_done, checkpoint_info(cfg, steps_done, "1 process"),
                           write_stage_state(step_dir, 0, trainer.state())};
      commit_checkpoint(ckpt_dir, m, cfg.train.keep_checkpoints);
    } catch (const UsageError& e) {
      // A full disk: the partial directory goes, the previous checkpoint stays the newest.
      remove_checkpoint(step_dir);
      throw UsageError(fmt::format("{} (the checkpoint after step {} was not written); {}", e.what(), steps_done,
                                   last_checkpoint_note(ckpt_dir)));
    }
  };
  install_stop_signals();
  for (int64_t s = trainer.step_index(); s < cfg.train.steps; ++s) {
    StepStats st = trainer.step();
    if (st.nonfinite) {
      std::fprintf(stderr, "step %lld: non-finite %s (loss %g, gradient norm %g): no update%s\n",
                   static_cast<long long>(s + 1), std::isfinite(st.loss) ? "gradient" : "loss", st.loss, st.grad_norm,
                   cfg.train.on_nonfinite == "stop" ? "; stopping (train.on_nonfinite = stop)" : ", step skipped");
      if (cfg.train.on_nonfinite == "stop") return 1;
    }
    std::optional<double> v;
    bool last = s + 1 == cfg.train.steps;
    if (last || (cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0)) v = valid = trainer.evaluate();
    try {
      log->step(st, v);
    } catch (const UsageError& e) {  // a full disk: the run stops (exit 2), naming its last checkpoint
      throw UsageError(fmt::format("{}; {}", e.what(), last_checkpoint_note(ckpt_dir)));
    }
    const bool periodic = !cfg.train.checkpoint_dir.empty() && cfg.train.checkpoint_every > 0 &&
                          (s + 1) % cfg.train.checkpoint_every == 0;
    if (periodic || stop_signal()) save_checkpoint(s + 1);
    if (stop_signal()) {
      std::fprintf(stderr, "pipefisher train: %s after step %lld: checkpoint written to %s; continue with --resume %s\n",
                   signal_name(stop_signal()), static_cast<long long>(s + 1),
                   checkpoint_step_dir(ckpt_dir, s + 1).c_str(), ckpt_dir.c_str());
      return 128 + stop_signal();
    }
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<const Param*> params;
  for (Param* p : trainer.model().params()) params.push_back(p);
  write_final_outputs(cfg, params, a.save, *log, valid, wall);
  std::printf("outputs: %s/{config.toml, log.jsonl, metrics.csv, model.safetensors, config.json, summary.json}%s\n", out.c_str(),
              a.save.empty() ? "" : (", " + a.save).c_str());
  return 0;
}

pf::app::Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<TrainArgs>();
  cmd.add_option("--config", a->config, "TOML configuration file (default: the built-in default job)");
  cmd.add_option("--set", a->sets, "override a configuration key: --set model.layers=4 (repeatable)")
      ->allow_extra_args(false);
  cmd.add_option("--init", a->init, "initial weights: a safetensors file or a checkpoint directory");
  cmd.add_option("--resume", a->resume,
                 "continue from the newest complete checkpoint in this directory (train.checkpoint_dir)");
  cmd.add_option("--save", a->save, "also save the final weights here (safetensors)");
  cmd.add_option("--steps", a->steps, "number of steps (overrides train.steps)")->check(CLI::PositiveNumber);
  cmd.add_option("--log-json", a->log_json, "write one JSON object per step to this file");
  cmd.add_flag("--overwrite", a->overwrite,
               "replace the outputs of another run (another config) in train.out_dir instead of refusing");
  cmd.add_flag("--print-config", a->print_config, "print the resolved configuration (every key) and exit");
  cmd.add_option("--profile-dir", a->profile_dir,
                 "record every action of every rank: timeline SVG, Chrome trace and profile.json here "
                 "(runs the MPI runtime, also for one process)");
  cmd.add_option("--profile-steps", a->profile_steps, "steps to profile, from 1 (default: all but the first)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  return [a] {
    try {
      return run_train(*a);
    } catch (const pf::UsageError&) {
      if (pf::launcher_rank() > 0) return 2;  // every rank finds the same mistake; rank 0 prints it
      throw;
    }
  };
}

}  // namespace

PF_COMMAND(train, "train", "train a model (one process, or pipeline x data parallel under scripts/pfrun)", setup)
