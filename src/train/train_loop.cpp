#include "train/train_loop.hpp"

#include "config/limits.hpp"
#include "core/error.hpp"
#include "core/machine.hpp"
#include "core/signals.hpp"
#include "core/files.hpp"
#include "data/batches.hpp"
#include "io/hf_model.hpp"
#include "train/checkpointing.hpp"
#include "train/preflight.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

namespace pf {

namespace {

// --- stop signals ---

volatile std::sig_atomic_t g_stop = 0;

extern "C" void on_stop_signal(int sig) { g_stop = sig; }

// SIGHUP: the terminal closed; stop as for SIGTERM rather than lose the steps.
void install_stop_signals() { catch_stop_signals(on_stop_signal, {SIGINT, SIGTERM, SIGUSR1, SIGHUP}); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

// What the phases share.
struct Run {
  TrainEngine& engine;
  Config cfg;
  const TrainRunArgs& args;
  std::string ckpt_dir;
  std::unique_ptr<RunLocks> locks;
  std::unique_ptr<RunLog> log;
  int64_t first_step = 0;
  double valid = 0;         // the latest validation loss
  std::string write_error;  // the root's first failed write (log, records): the run stops after the step
  bool continuing = false;  // auto-resume: the run in out_dir goes on from its checkpoint
  std::string run_id;       // the root's: owner.json's id, carried by every manifest it writes
  int64_t skipped_in_a_row = 0;   // non-finite steps since the last finite one
  int64_t last_finite_step = -1;  // 1-based; 0: none yet in this process's steps
};

// train.on_nonfinite = skip skips a step whose loss or gradient is not finite (a bad batch), but
// a run that produces nothing else has diverged: past this many in a row it stops, nonzero.
constexpr int64_t kMaxSkippedInARow = 5;

// The loop's steps run while in scope (the engine reports a death meanwhile).
struct StepsRunning {
  TrainEngine& engine;
  explicit StepsRunning(TrainEngine& e) : engine(e) { engine.steps_running(true); }
  ~StepsRunning() { engine.steps_running(false); }
};

// --- set-up ---

void print_banner(const Run& r) {
  if (!r.engine.root()) return;
  const EngineBanner b = r.engine.banner();
  const ModelConfig& m = r.cfg.model;
  const ParallelConfig& p = r.cfg.parallel;
  const long long tokens = static_cast<long long>(p.data_parallel) * p.micro_batches * p.micro_batch_size * m.seq_len;
  auto count = [](int n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); };
  // Grouped-query attention says how many key/value heads the query heads share.
  const std::string heads = count(m.heads, "head", "heads") +
                            (kv_heads_of(m) != m.heads ? fmt::format(" ({} key/value)", kv_heads_of(m)) : "");
  std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %s), %lld tokens/step (%s x %s x %s of %d "
              "tokens), %s, %d steps%s\n",
              preset_of(m).c_str(), name_of(m.arch).c_str(), m.layers, m.hidden, heads.c_str(), tokens,
              count(p.data_parallel, "replica", "replicas").c_str(),
              count(p.micro_batches, "micro-batch", "micro-batches").c_str(),
              count(p.micro_batch_size, "sequence", "sequences").c_str(), m.seq_len, optimizer_of(r.cfg).c_str(),
              r.cfg.train.steps, b.layout.c_str());
  const std::string params = parameters_line(b.stage_parameters);
  if (!params.empty()) std::printf("%s\n", params.c_str());
  for (const std::string& n : b.notes) std::printf("%s\n", n.c_str());
  std::fflush(stdout);
}

// The root's first writes, after every refusal: the locks, --overwrite's removal of the previous
// run's outputs, config.toml and the logs.
void open_outputs(Run& r, const RunOutputs& outputs, const std::vector<std::string>& notes,
                  const CheckpointReader* resume) {
  r.locks = lock_output_dirs(r.cfg, outputs);
  if (outputs.overwrite && !outputs.resuming) remove_previous_outputs(r.cfg);
  r.run_id = claim_checkpoint_dir(r.cfg);
  for (const std::string& n : notes) std::fprintf(stderr, "pipefisher train: %s\n", n.c_str());
  if (!checkpoints_on(r.cfg))
    std::fprintf(stderr, "pipefisher train: checkpoints are off (train.checkpoint_every = 0): a stopped run cannot "
                 "continue, it starts over\n");
  if (resume) {
    const std::string how = r.continuing ? fmt::format(": the run in {} continues (--overwrite starts it over)",
                                                       r.cfg.train.out_dir) : "";
    std::printf("resuming from %s (step %lld)%s\n", resume->dir().c_str(), static_cast<long long>(r.first_step),
                how.c_str());
    if (r.first_step == r.cfg.train.steps)
      std::printf("its run's %d steps are done: the final evaluation and outputs follow\n", r.cfg.train.steps);
  }
  r.log = open_run_outputs(r.cfg, r.first_step > 0 ? r.first_step : -1, r.cfg.kfac.enabled);
}

// Auto-resume (preflight.hpp's continues_its_run), without --resume or --overwrite: the root
// decides, every process learns it (the processes may see the files at different moments).
bool continues(Run& r) {
  if (!r.args.resume.empty() || r.args.overwrite) return false;
  double yes[1] = {0};
  r.engine.on_root([&] { yes[0] = continues_its_run(r.cfg) ? 1 : 0; });
  r.engine.sum(yes);
  return yes[0] > 0;
}

// The files a checkpoint's reader reads (its manifest and tensors), named `what`.
void add_checkpoint_files(std::vector<NamedPath>& in, const CheckpointReader* r, const std::string& what) {
  if (!r) return;
  in.push_back({r->dir() + "/manifest.json", what});
  for (const auto& f : r->files()) in.push_back({f->path(), what});
}

// What the checks of the set-up opened, for the loads and writes after them.
struct Checked {
  std::string init_path;  // --init, unless the run continues
  std::unique_ptr<CheckpointReader> init, resume;
  RunOutputs outputs;
  std::vector<std::string> notes;
};

// Everything that can refuse the run but the loads into its model (files, checkpoints, output
// paths); nothing is written. --dry-run runs exactly this, then the build and loads.
Checked check_run(Run& r) {
  TrainEngine& e = r.engine;
  const TrainRunArgs& a = r.args;
  Checked c;
  r.cfg.check_files();
  check_eval_batches(r.cfg, *make_batcher(r.cfg.model, r.cfg.data, true));
  r.continuing = continues(r);
  const std::string resume_dir = r.continuing ? r.ckpt_dir : a.resume;
  // A continued run's weights are its checkpoint's (as Trainer's resume over from_pretrained).
  if (r.continuing && !a.init.empty()) c.notes.push_back("--init " + a.init + ": not loaded, the run continues");
  c.init_path = r.continuing ? "" : a.init;
  c.init = open_init_checkpoint(c.init_path, a.resume, r.cfg.model);
  if (!resume_dir.empty()) {
    c.resume = open_resume_checkpoint(r.cfg, resume_dir, r.continuing ? "train.checkpoint_dir" : "--resume", c.notes);
    check_kfac_layout(r.cfg, c.resume->manifest(), e.layout_name(), resume_dir);
  }
  c.outputs = {a.save, a.profile_dir, a.log_json_from_flag, !a.resume.empty(), r.continuing, a.overwrite, "", {}};
  c.outputs.inputs = {a.config, {c.init_path, "--init"}};  // a checkpoint directory's files instead, below
  add_checkpoint_files(c.outputs.inputs, c.init.get(), "--init");
  add_checkpoint_files(c.outputs.inputs, c.resume.get(), r.continuing ? "train.checkpoint_dir" : "--resume");
  if (c.resume) c.outputs.resume_dir = std::filesystem::path(c.resume->dir()).parent_path().string();
  e.on_root([&] { check_output_paths(r.cfg, c.outputs); });
  return c;
}

// The model, with --init's or the checkpoint's tensors (a shape that differs is refused here).
void load_model(Run& r, Checked& c) {
  TrainEngine& e = r.engine;
  e.build(r.cfg);
  e.load_init(c.init_path, c.init.get());
  c.init.reset();  // unmaps the files
  if (!c.resume) return;
  e.load_resume(*c.resume);
  r.first_step = c.resume->manifest().step;
}

// The run's first writes, after every refusal.
void set_up(Run& r, Checked& c) {
  r.engine.on_root([&] { open_outputs(r, c.outputs, c.notes, c.resume.get()); });
  c.resume.reset();
  r.engine.open_outputs();
  print_banner(r);
}

// --dry-run, in place of the first write: the notes the run would print, then the report (root).
int dry_run(Run& r, const Checked& c) {
  if (!r.engine.root()) return 0;
  for (const std::string& n : c.notes) std::fprintf(stderr, "pipefisher train: %s\n", n.c_str());
  return r.args.dry_run(r.cfg);
}

// --- the phases of a step ---

// Step: false when the run stops on a non-finite step (train.on_nonfinite = stop).
bool take_step(Run& r, int64_t s, StepStats& st) {
  r.args.seams.signal.at(SignalSeam::Where::step, s + 1);
  EngineStep o = r.engine.step(s);
  if (r.write_error.empty()) r.write_error = o.write_error;
  st = o.stats;
  if (!st.nonfinite) {
    r.skipped_in_a_row = 0;
    r.last_finite_step = s + 1;
    return true;
  }
  const bool stop = r.cfg.train.on_nonfinite == OnNonfinite::Stop;
  if (r.engine.root())
    std::fprintf(stderr, "step %lld: non-finite %s (loss %g, gradient norm %g): no update%s\n",
                 static_cast<long long>(s + 1), std::isfinite(st.loss) ? "gradient" : "loss", st.loss, st.grad_norm,
                 stop ? "; stopping (train.on_nonfinite = stop)" : ", step skipped");
  if (stop) return false;
  if (++r.skipped_in_a_row <= kMaxSkippedInARow) return true;
  if (r.engine.root())
    std::fprintf(stderr, "pipefisher train: %lld steps in a row were not finite: the run diverged, stopping "
                 "(train.on_nonfinite = skip skips at most %lld in a row); the last finite step was %s; %s\n",
                 static_cast<long long>(r.skipped_in_a_row), static_cast<long long>(kMaxSkippedInARow),
                 r.last_finite_step > 0 ? std::to_string(r.last_finite_step).c_str() : "none of this run's",
                 last_checkpoint_note(r.ckpt_dir).c_str());
  return false;
}

// A stop signal cuts an evaluation short (within a micro-batch): the run stops after it.
bool stop_seen() { return g_stop != 0; }

// Evaluate: after every train.eval_every steps and after the last. Nothing when not due, or cut
// short by a stop signal (agreed_stop then stops the run).
std::optional<double> evaluate_after(Run& r, int64_t s) {
  const int every = r.cfg.train.eval_every;
  if (s + 1 != r.cfg.train.steps && !(every > 0 && (s + 1) % every == 0)) return std::nullopt;
  r.args.seams.signal.at(SignalSeam::Where::eval, s + 1);
  const std::optional<double> valid = r.engine.evaluate(stop_seen);
  if (valid) r.valid = *valid;
  return valid;
}

// A validation loss that is not finite after a finite step: its update overflowed the weights,
// the run diverged. It stops (status 1) before that state is checkpointed or written as the
// run's result. (After a skipped step, take_step's count of skipped steps decides.)
bool diverged(const Run& r, int64_t steps_done, std::optional<double> valid) {
  if (!valid || std::isfinite(*valid) || r.skipped_in_a_row > 0) return false;
  if (r.engine.root())
    std::fprintf(stderr, "pipefisher train: validation loss %g after step %lld: the run diverged (a smaller optim.lr?); "
                 "its weights are not written as its result; %s\n", *valid, static_cast<long long>(steps_done),
                 last_checkpoint_note(r.ckpt_dir).c_str());
  return true;
}

// Collective: every rank's peak resident set so far at the root, by rank (empty elsewhere).
std::vector<double> rank_peaks(Run& r) {
  std::vector<double> peaks;
  for (const std::string& s : r.engine.gather(fmt::format("{}", process_memory().peak_rss))) peaks.push_back(std::stod(s));
  return peaks;
}

// Collective (the ranks' peaks); the root writes the step's record.
void log_step(Run& r, const StepStats& st, std::optional<double> valid) {
  const std::vector<double> peaks = rank_peaks(r);
  if (!r.engine.root() || !r.write_error.empty()) return;
  try {
    r.log->step(st, valid, peaks);
  } catch (const UsageError& e) {  // a full disk: the run stops (exit 2), naming its last checkpoint
    r.write_error = e.what();
  }
}

// Stop: signals reach the processes at different moments; they agree to stop after the step in
// which any of them saw one (the signal, 0 for none). A write error of the root stops every
// process with status 2.
int agreed_stop(Run& r) {
  double flags[2] = {static_cast<double>(g_stop), r.write_error.empty() ? 0.0 : 1.0};
  r.engine.sum(flags);
  if (flags[1] > 0)
    throw UsageError(fmt::format("{}; {}", r.write_error.empty() ? "a write error on rank 0" : r.write_error,
                                 last_checkpoint_note(r.ckpt_dir)));
  if (flags[0] == 0) return 0;
  return g_stop ? static_cast<int>(g_stop) : SIGTERM;
}

// Every train.checkpoint_every steps, and after the last step: a finished run can be extended.
bool checkpoint_due(const Config& cfg, int64_t steps_done) {
  return checkpoints_on(cfg) && (steps_done % cfg.train.checkpoint_every == 0 || steps_done == cfg.train.steps);
}

// One process's list of checkpoint files, or its write error, as the bytes gathered to the root.
std::string files_record(const std::vector<CheckpointFile>& files, const std::string& error) {
  if (!error.empty()) return "E" + error;
  nlohmann::json j = nlohmann::json::array();
  for (const CheckpointFile& f : files) j.push_back({f.name, f.bytes, f.sha256});
  return "F" + j.dump();
}

// Checkpoint: the root makes the step directory, every process writes its files, the root
// gathers their checksums and commits the manifest, then `latest`. A failure (a full disk)
// removes the partial directory: the previous checkpoint stays the newest.
void save_checkpoint(Run& r, int64_t steps_done) {
  TrainEngine& e = r.engine;
  const std::string step_dir = checkpoint_step_dir(r.ckpt_dir, steps_done);
  auto failed = [&](const std::string& why) {
    remove_checkpoint(step_dir);
    return UsageError(fmt::format("{} (the checkpoint after step {} was not written); {}", why, steps_done,
                                  last_checkpoint_note(r.ckpt_dir)));
  };
  e.on_root([&] {
    remove_checkpoint(step_dir);  // an interrupted earlier attempt at this step
    try {
      make_dirs(step_dir, "train.checkpoint_dir");
    } catch (const UsageError& err) {
      throw failed(err.what());
    }
  });
  std::vector<CheckpointFile> mine;
  std::string error;
  try {
    mine = e.write_checkpoint(step_dir);
  } catch (const UsageError& err) {
    error = err.what();
  }
  const std::vector<std::string> all = e.gather(files_record(mine, error));
  e.on_root([&] {
    CheckpointManifest m{steps_done, checkpoint_info(r.cfg, steps_done, e.layout_name()), {}};
    m.info["run"] = r.run_id;  // retention removes only this run's checkpoints
    try {
      for (const std::string& rec : all) {
        if (rec[0] == 'E') throw UsageError(rec.substr(1));
        for (const auto& f : nlohmann::json::parse(rec.substr(1)))
          m.files.push_back({f[0].get<std::string>(), f[1].get<uint64_t>(), f[2].get<std::string>()});
      }
      commit_checkpoint(r.ckpt_dir, m, r.cfg.train.keep_checkpoints);
    } catch (const UsageError& err) {
      throw failed(err.what());
    }
  });
  e.checkpoint_written();
}

// The line a stopped run ends with: its checkpoint, or that it wrote none.
void say_stopped(const Run& r, int sig, int64_t steps_done) {
  if (checkpoints_on(r.cfg))
    std::fprintf(stderr, "pipefisher train: %s after step %lld: checkpoint written to %s; continue with --resume %s\n",
                 signal_name(sig), static_cast<long long>(steps_done), checkpoint_step_dir(r.ckpt_dir, steps_done).c_str(),
                 r.ckpt_dir.c_str());
  else
    std::fprintf(stderr, "pipefisher train: %s after step %lld: no checkpoint written (train.checkpoint_every = 0)\n",
                 signal_name(sig), static_cast<long long>(steps_done));
}

// Every step: step, evaluate, log, checkpoint, stop. Returns the exit status of a run that ends
// before its final outputs, nothing when they follow.
std::optional<int> run_steps(Run& r) {
  for (int64_t s = r.first_step; s < r.cfg.train.steps; ++s) {
    StepStats st;
    if (!take_step(r, s, st)) return 1;
    const std::optional<double> valid = evaluate_after(r, s);
    log_step(r, st, valid);
    if (diverged(r, s + 1, valid)) return 1;
    const int sig = agreed_stop(r);
    if ((sig && checkpoints_on(r.cfg)) || checkpoint_due(r.cfg, s + 1)) save_checkpoint(r, s + 1);
    if (sig) {
      if (r.engine.root()) say_stopped(r, sig, s + 1);
      return 128 + sig;
    }
  }
  // Weights the last steps could not update (they overflow the forward) are no result.
  if (r.skipped_in_a_row > 0) {
    if (r.engine.root())
      std::fprintf(stderr, "pipefisher train: the last %lld steps were not finite: the run's weights are not written "
                   "as its result; %s\n", static_cast<long long>(r.skipped_in_a_row),
                   last_checkpoint_note(r.ckpt_dir).c_str());
    return 1;
  }
  return std::nullopt;
}

// --- finish ---

// Collective: every rank's peak memory at the root, with the check's estimate of the whole job.
MemoryUse memory_use(Run& r) {
  const ProcessMemory mine = process_memory();
  MemoryUse use;
  for (const std::string& s : r.engine.gather(fmt::format("{} {}", mine.peak_rss, mine.file_rss))) {
    double peak = 0, file = 0;
    std::istringstream(s) >> peak >> file;
    use.peak_rss.push_back(peak);
    use.file_rss.push_back(file);
  }
  const int ranks = static_cast<int>(use.peak_rss.size());
  use.estimate = estimate_peak_bytes(r.cfg, ranks, ranks);
  return use;
}

// A write error (a full disk) names the last complete checkpoint, as during the steps.
void write_final_outputs(Run& r, const FinalRecords& rec, const MemoryUse& memory, double wall) {
  const std::string& out = r.cfg.train.out_dir;
  const RunSummary summary = r.log->summary(r.valid, wall, memory, r.engine.banner().stage_parameters, rec.plan);
  try {
    if (!rec.write_error.empty()) throw UsageError(rec.write_error);
    require_finite(rec.params, out + "/model.safetensors");
    save_hf_model(out, rec.params, r.cfg.model);
    r.args.seams.signal.at(SignalSeam::Where::final_writes);
    if (!r.args.save.empty()) save_trained_weights(r.args.save, rec.params);
    for (const auto& [name, text] : rec.files) write_file_atomic(out + "/" + name, text);
    write_file_atomic(out + "/summary.json", summary.json);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}; {}", e.what(), last_checkpoint_note(r.ckpt_dir)));
  }
  std::string listed;
  for (const std::string& name : rec.listed) listed += ", " + name;
  std::string elsewhere;  // outputs outside out_dir's files (directories, --save)
  if (!r.args.save.empty()) elsewhere += ", " + r.args.save;
  if (!r.args.profile_dir.empty()) elsewhere += ", " + r.args.profile_dir + "/";
  if (checkpoints_on(r.cfg)) elsewhere += ", " + r.ckpt_dir + "/";
  std::printf("outputs: %s/{config.toml, log.jsonl, metrics.csv, model.safetensors, config.json, summary.json%s}%s\n",
              out.c_str(), listed.c_str(), elsewhere.c_str());
  std::printf("%s\n", summary.line.c_str());  // last: what the run achieved
}

// The final evaluation when no step ran (a run resumed at its end), then the final outputs.
int finish(Run& r, double wall) {
  if (r.first_step == r.cfg.train.steps) {
    const std::optional<double> valid = r.engine.evaluate(stop_seen);
    if (!valid) {
      const int sig = agreed_stop(r);
      if (r.engine.root()) say_stopped(r, sig, r.first_step);
      return 128 + sig;
    }
    if (diverged(r, r.first_step, r.valid = *valid)) return 1;
  }
  const FinalRecords rec = r.engine.finish(r.cfg.train.out_dir);
  const MemoryUse memory = memory_use(r);
  r.engine.on_root([&] { write_final_outputs(r, rec, memory, wall); });
  if (g_stop && r.engine.root())
    std::fprintf(stderr, "pipefisher train: %s after the last step: the final outputs were written, the run is "
                 "complete\n", signal_name(g_stop));
  return 0;
}

}  // namespace

int run_training(TrainEngine& engine, Config cfg, const TrainRunArgs& args) {
  Run r{engine, std::move(cfg), args, "", nullptr, nullptr, 0, 0, "", false, ""};
  r.ckpt_dir = checkpoint_dir_of(r.cfg);
  Checked checked = check_run(r);
  if (!args.dry_run || engine.builds_here()) load_model(r, checked);
  if (args.dry_run) return dry_run(r, checked);
  set_up(r, checked);
  install_stop_signals();
  StepsRunning running(engine);
  const auto t0 = std::chrono::steady_clock::now();
  if (const std::optional<int> status = run_steps(r)) return *status;
  return finish(r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace pf
