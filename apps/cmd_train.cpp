// `pipefisher train`: trains a model from a TOML config; with no arguments, the built-in default
// job (a short bert-mini pretraining run on the real corpus).
#include "command.hpp"
#include "config/config.hpp"
#include "config/limits.hpp"
#include "config/paths.hpp"
#include "core/error.hpp"
#include "train/mpi_run.hpp"
#include "train_dry_run.hpp"
#include "train/one_process.hpp"
#include "train/run_dir.hpp"
#include "train/test_seams.hpp"
#include "train/train_loop.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace {

struct TrainArgs {
  std::string config, init, save, log_json, resume;
  std::vector<std::string> sets;
  int steps = 0;
  std::string profile_dir;
  std::vector<int> profile_steps;
  bool print_config = false;
  bool dry_run = false;
  bool overwrite = false;
  std::string test_poison, test_signal, test_oom_counter;  // hidden: tests/faults (train/test_seams.hpp)
  std::string test_drift_at, test_kfac_cost_scale, test_bcast_model;  // hidden: tests/runtime
  bool test_fixed_costs = false;
  std::string bench_slow, bench_jitter;  // benchmarks' noise (train/test_seams.hpp)
};

// Whether a --set chose `key`.
bool set_on_command_line(const std::vector<std::string>& sets, const std::string& key) {
  for (const std::string& s : sets)
    if (s.rfind(key + "=", 0) == 0) return true;
  return false;
}

// A run continued through its own config.toml (--resume RUN, or --config RUN/config.toml) continues
// it where it now is (run_dir.hpp's relocate_run): a copy of a run never writes into the
// original. Not when a --set names another train.out_dir.
void relocate_own_run(const TrainArgs& a, const std::string& config, pf::Config& cfg) {
  const std::string run = a.resume.empty() ? pf::run_dir_of_config(config) : pf::run_dir_of_resume(a.resume);
  std::error_code ec;
  if (run.empty() || set_on_command_line(a.sets, "train.out_dir") ||
      !std::filesystem::equivalent(config, std::filesystem::path(run) / "config.toml", ec))
    return;
  pf::relocate_run(cfg, run, !a.log_json.empty() || set_on_command_line(a.sets, "train.log_json"));
}

int run_train(const TrainArgs& a) {
  using namespace pf;
  // A Hugging Face folder's model shape first (from_pretrained), the command's --set over it.
  std::vector<std::string> sets = init_model_sets(a.init);
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  if (a.steps > 0) sets.push_back(fmt::format("train.steps={}", a.steps));
  // A resumed run continues its own configuration (the config.toml beside its checkpoints).
  const std::string config = config_for(a.config, a.resume);
  Config cfg = Config::load(config, sets);
  relocate_own_run(a, config, cfg);
  if (!a.log_json.empty()) cfg.train.log_json = absolute_path(a.log_json);
  if (a.print_config) {
    std::fputs(cfg.to_toml().c_str(), stdout);
    return 0;
  }
  // data_parallel = auto from the world as launched; a dry run without mpirun previews one replica.
  const bool preview = a.dry_run && launcher_world_size() == 1;
  resolve_data_parallel(cfg, preview ? cfg.parallel.stages : launcher_world_size());
  // --dry-run takes the run's own path to its first write (train_loop.hpp), so that it refuses
  // whatever the run refuses.
  const TrainRunArgs run{run_weights_of(a.init), a.save, resume_dir_of(a.resume, cfg),
                         {config, a.config.empty() ? "the run's config.toml" : "--config"}, a.profile_dir,
                         !a.log_json.empty(), a.overwrite,
                         {parse_poison_flag(a.test_poison), parse_signal_flag(a.test_signal),
                          parse_kfac_flags(a.test_drift_at, a.test_kfac_cost_scale, a.test_bcast_model, a.test_fixed_costs),
                          a.test_oom_counter, parse_noise_flags(a.bench_slow, a.bench_jitter)},
                         a.dry_run ? std::function<int(const Config&)>(pf::app::train_dry_run) : nullptr};
  // A dry run without mpirun checks the layout as launched with the ranks it needs.
  const int ranks = preview ? cfg.parallel.stages * cfg.parallel.data_parallel : launcher_world_size();
  if (run.seams.noise.slow_rank >= ranks)
    usage_error("--bench-slow", "rank {} but the run has {} rank{}", run.seams.noise.slow_rank, ranks, ranks == 1 ? "" : "s");
  // Several ranks, a pipeline/data-parallel layout or the profiler: the MPI runtime (src/runtime).
  if (cfg.parallel.stages * cfg.parallel.data_parallel > 1 || launcher_world_size() > 1 || !a.profile_dir.empty() ||
      run.seams.noise.on())
    return run_parallel_training(cfg, run, {a.profile_steps.begin(), a.profile_steps.end()});
  if (!a.profile_steps.empty()) usage_error("--profile-steps", "only applies with --profile-dir");
  check_resources(cfg);
  OneProcessEngine engine(run.seams.poison);
  return run_training(engine, std::move(cfg), run);
}

pf::app::Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<TrainArgs>();
  cmd.add_option("--config", a->config,
                 "TOML configuration file (default: with --resume the run's own config.toml, else the built-in "
                 "default job)");
  cmd.add_option("--set", a->sets, "override a configuration key: --set model.layers=4 (repeatable)")
      ->allow_extra_args(false);
  cmd.add_option("--init", a->init,
                 "initial weights: a run directory (its model.safetensors), a Hugging Face model folder "
                 "(model.safetensors, and config.json for the model's shape), a safetensors file or a checkpoint "
                 "directory");
  cmd.add_option("--resume", a->resume,
                 "continue from the newest complete checkpoint in this directory (train.checkpoint_dir; "
                 "RUN/checkpoints), with the run's own configuration (RUN/config.toml) and --set over it");
  cmd.add_option("--save", a->save, "also save the final weights here (safetensors)");
  cmd.add_option("--steps", a->steps, "number of steps (overrides train.steps)")->check(pf::app::kPositiveInteger);
  cmd.add_option("--log-json", a->log_json, "write one JSON object per step to this file");
  cmd.add_flag("--overwrite", a->overwrite,
               "start over: replace the outputs and checkpoints of the run in train.out_dir instead of continuing "
               "it (the same config) or refusing (another)");
  cmd.add_flag("--print-config", a->print_config, "print the resolved configuration (every key) and exit");
  cmd.add_flag("--dry-run", a->dry_run,
               "check the configuration and every input, print the memory estimate and, for a pipeline, plan's "
               "report of its schedule (with PipeFisher, its plan); write nothing");
  cmd.add_option("--profile-dir", a->profile_dir,
                 "record every action of every rank: timeline SVG, Chrome trace and profile.json here "
                 "(runs the MPI runtime, also for one process)");
  cmd.add_option("--profile-steps", a->profile_steps, "steps to profile, from 1 (default: all but the first)")
      ->delimiter(',')
      ->check(pf::app::kPositiveInteger);
  cmd.add_option("--bench-slow", a->bench_slow,
                 "RANK:FACTOR[@FROM-TO]: benchmarks only: world rank RANK's compute actions last FACTOR (1 to 100) "
                 "times as long, in steps FROM..TO (the extra time slept; the math is unchanged)")
      ->group("Benchmarks");
  cmd.add_option("--bench-jitter", a->bench_jitter,
                 "FRACTION: benchmarks only: every compute action lasts (1 + FRACTION u) times as long, u uniform in "
                 "[0, 1), the same each run")
      ->group("Benchmarks");
  // Test seams, left out of --help (group ""): train/test_seams.hpp.
  cmd.add_option("--test-poison", a->test_poison, "STEP:KIND (nan, inf, loss): make a step non-finite")->group("");
  cmd.add_option("--test-signal", a->test_signal, "SIG@WHERE: raise a signal at step:N, eval:N or final-writes")
      ->group("");
  cmd.add_option("--test-drift-at", a->test_drift_at, "STEP: steps STEP..STEP+2 count as 10x their time")->group("");
  cmd.add_option("--test-kfac-cost-scale", a->test_kfac_cost_scale, "X[,Y]: the planner sees K-FAC costs times X (adaptive's re-plans: times Y)")->group("");
  cmd.add_option("--test-bcast-model", a->test_bcast_model, "ALPHA,BETA: the broadcast model, ms and ms per byte")
      ->group("");
  cmd.add_flag("--test-fixed-costs", a->test_fixed_costs, "the planner sees made-up costs, not the measured ones")->group("");
  cmd.add_option("--test-oom-counter", a->test_oom_counter, "FILE: read the out-of-memory kill count here")->group("");
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

PF_COMMAND(train, "train", "Train a model (one process, or pipeline x data parallel under scripts/pfrun)", setup)
