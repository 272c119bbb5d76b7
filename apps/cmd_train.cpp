// `pipefisher train`: trains a model from a TOML config; with no arguments, the built-in default
// job (a short bert-mini pretraining run on the real corpus).
#include "command.hpp"
#include "config/config.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "runtime/train_run.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <chrono>
#include <filesystem>
#include <fmt/format.h>

namespace {

struct TrainArgs {
  std::string config, init, save, log_json;
  std::vector<std::string> sets;
  int steps = 0;
  std::string profile_dir;
  std::vector<int> profile_steps;
  bool print_config = false;
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
    return run_parallel_training(cfg, {a.init, a.save, {a.profile_dir, {a.profile_steps.begin(), a.profile_steps.end()}}});
  if (!a.profile_steps.empty()) usage_error("--profile-steps", "only applies with --profile-dir");
  cfg.check_files();
  if (!a.init.empty() && !std::filesystem::is_regular_file(a.init))
    usage_error("--init", "no such file '{}'", a.init);

  // Everything that can be refused has been: from here on the run writes its outputs.
  Trainer trainer(cfg);
  if (!a.init.empty()) load_safetensors(a.init, trainer.model().params());
  const std::string& out = cfg.train.out_dir;
  make_dirs(out, "train.out_dir");
  write_file_atomic(out + "/config.toml", cfg.to_toml());
  std::vector<std::string> logs{out + "/log.jsonl"};
  if (!cfg.train.log_json.empty()) logs.push_back(cfg.train.log_json);

  const auto& m = cfg.model;
  std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %d heads), %lld tokens/step "
              "(%d x %d x %d sequences of %d), %s, %d steps\n",
              m.preset.empty() ? "custom" : m.preset.c_str(), m.arch.c_str(), m.layers, m.hidden, m.heads,
              static_cast<long long>(trainer.tokens_per_step()), cfg.parallel.data_parallel,
              cfg.parallel.micro_batches, cfg.parallel.micro_batch_size, m.seq_len, cfg.optim.name.c_str(),
              cfg.train.steps);
  std::fflush(stdout);

  auto t0 = std::chrono::steady_clock::now();
  RunLog log(cfg.train.steps, cfg.train.log_every, logs);
  double valid = 0;
  for (int s = 0; s < cfg.train.steps; ++s) {
    StepStats st = trainer.step();
    std::optional<double> v;
    bool last = s + 1 == cfg.train.steps;
    if (last || (cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0)) v = valid = trainer.evaluate();
    log.step(st, v);
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<const Param*> params;
  for (Param* p : trainer.model().params()) params.push_back(p);
  save_safetensors(out + "/model.safetensors", params);
  if (!a.save.empty()) save_safetensors(a.save, params);
  write_file_atomic(out + "/summary.json", log.summary(valid, wall));
  std::printf("outputs: %s/{config.toml, log.jsonl, model.safetensors, summary.json}%s\n", out.c_str(),
              a.save.empty() ? "" : (", " + a.save).c_str());
  return 0;
}

pf::app::Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<TrainArgs>();
  cmd.add_option("--config", a->config, "TOML configuration file (default: the built-in default job)");
  cmd.add_option("--set", a->sets, "override a configuration key: --set model.layers=4 (repeatable)")
      ->allow_extra_args(false);
  cmd.add_option("--init", a->init, "initial weights (safetensors)");
  cmd.add_option("--save", a->save, "also save the final weights here (safetensors)");
  cmd.add_option("--steps", a->steps, "number of steps (overrides train.steps)")->check(CLI::PositiveNumber);
  cmd.add_option("--log-json", a->log_json, "write one JSON object per step to this file");
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
