#include "runtime/train_run.hpp"

#include "comm/collectives.hpp"
#include "comm/rank_monitor.hpp"
#include "comm/small.hpp"
#include "comm/world.hpp"
#include "config/limits.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "io/checkpoint.hpp"
#include "io/hf_model.hpp"
#include "io/safetensors.hpp"
#include "optim/lr_schedule.hpp"
#include "runtime/config_agreement.hpp"
#include "runtime/executor.hpp"
#include "runtime/layout.hpp"
#include "schedule/validate.hpp"
#include "train/checkpointing.hpp"
#include "train/preflight.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

namespace pf {

namespace {

int env_int(const char* a, const char* b, int dflt) {
  for (const char* name : {a, b})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return dflt;
}



// Collective: every rank's ActivationMemory (executor.hpp), for rank 0's activations.json; rank 0
// also prints the worst device's peak. Empty on other ranks.
std::string activation_memory_json(const Executor& exec, const comm::Groups& groups, MPI_Comm world) {
  const ActivationMemory m = exec.activation_memory();
  nlohmann::json j{{"device", groups.stage}, {"replica", groups.replica}, {"peak_bytes", m.peak_bytes},
                   {"allocated_bytes", m.allocated_bytes}};
  for (const auto& st : m.stages)
    j["stages"].push_back({{"pipeline", st.pipeline}, {"stage", st.stage}, {"state_bytes", st.state_bytes},
                           {"input_bytes", st.input_bytes}});
  const std::vector<std::string> all = comm::gather_bytes(j.dump(), 0, world);
  if (all.empty()) return "";
  nlohmann::json out{{"recompute", m.recompute}, {"ranks", nlohmann::json::array()}};
  int64_t worst = 0;
  for (const std::string& r : all) {
    out["ranks"].push_back(nlohmann::json::parse(r));
    worst = std::max(worst, out["ranks"].back()["peak_bytes"].get<int64_t>());
  }
  std::printf("activation memory: at most %.3f MB held at once on a device (parallel.recompute = %s)\n", worst / 1e6,
              m.recompute ? "true" : "false");
  return out.dump(2) + "\n";
}

int train(const comm::World& world, Config cfg, const ParallelRunArgs& a) {
  const bool root = world.rank() == 0;
  if (cfg.kfac.enabled && cfg.kfac.placement == "bubbles" && cfg.parallel.stages == 1)
    usage_error("kfac.placement", "'bubbles' fills pipeline bubbles and parallel.stages = 1 has none: use 'inline' "
                "(the default with one stage) or 'skip'");
  Layout layout;
  try {
    layout = make_layout(cfg, world.size());
  } catch (const ScheduleError& e) {
    if (root) std::fprintf(stderr, "%s", e.grid.c_str());
    throw;
  }
  cfg.check_files();
  std::unique_ptr<CheckpointReader> init_ckpt = open_init_checkpoint(a.init, a.resume);
  // Every rank finds and verifies the same checkpoint (a shared file system), so an error is alike on all.
  std::unique_ptr<CheckpointReader> resume;
  std::vector<std::string> notes;
  const ParallelConfig& p = cfg.parallel;
  const std::string layout_name = fmt::format("{} stages ({}) x {} data-parallel", p.stages, layout.schedule.name,
                                              p.data_parallel);
  if (!a.resume.empty()) {
    resume = open_resume_checkpoint(cfg, a.resume, notes);
    // Each rank's K-FAC state (its chunks' factors, cycle, plan) belongs to its place in the
    // layout: it continues only in the same one. Weights and optimizer state load into any.
    if (cfg.kfac.enabled) {
      auto it = resume->manifest().info.find("layout");
      const std::string was = it == resume->manifest().info.end() ? "an unrecorded layout" : it->second;
      if (was != layout_name)
        usage_error("--resume", "the checkpoint's K-FAC state was written by {}, this run is {}: it continues only in "
                    "the same layout (start from its weights with --init {})", was, layout_name, a.resume);
    }
  }
  // Every output path writable, before the first allocation of the model; then the directories
  // locked against another run (rank 0 writes them).
  std::unique_ptr<RunLocks> locks;
  comm::on_root_agreed(world.rank(), [&] {
    const RunOutputs outputs{a.save, a.profile.dir, a.log_json_from_flag, !a.resume.empty(), a.overwrite};
    check_output_paths(cfg, outputs);
    locks = lock_output_dirs(cfg, outputs);
    for (const std::string& n : notes) std::fprintf(stderr, "pipefisher train: %s\n", n.c_str());
  });
  comm::Groups groups = comm::make_groups(world, cfg.parallel.stages, cfg.parallel.data_parallel);
  set_threads(comm::threads_per_rank(cfg.train.threads));

  auto train_data = make_batcher(cfg.model, cfg.data, false);
  auto valid_data = make_batcher(cfg.model, cfg.data, true);
  Executor exec(cfg, layout, groups);
  if (init_ckpt) {
    for (auto& c : exec.chunk_states()) init_ckpt->load_params(c.state.params);
    init_ckpt.reset();
  } else if (!a.init.empty()) {
    exec.load(a.init);
  }
  int64_t first_step = 0;
  if (resume) {
    for (auto& c : exec.chunk_states()) {
      c.state.kfac = nullptr;  // this rank's own copy, below (replicas and twins differ mid-cycle)
      load_train_state(*resume, c.state);
    }
    exec.load_kfac_state(*resume);
    first_step = resume->manifest().step;
    if (root) std::printf("resuming from %s (step %lld)\n", resume->dir().c_str(), static_cast<long long>(first_step));
    resume.reset();
  }
  Profiler profiler(cfg, layout, groups, exec, a.profile);

  // Rank 0's outputs, prepared before the first step so a bad path fails every rank now.
  const std::string& out = cfg.train.out_dir;
  std::unique_ptr<RunLog> log;
  comm::on_root_agreed(world.rank(), [&] {
    log = open_run_outputs(cfg, first_step > 0 ? first_step : -1, cfg.kfac.enabled);
  });

  std::vector<MicroBatch> mbs(static_cast<size_t>(p.data_parallel) * p.micro_batches);
  for (MicroBatch& mb : mbs) mb.resize(p.micro_batch_size, cfg.model.seq_len);
  const int64_t tokens = static_cast<int64_t>(mbs.size()) * p.micro_batch_size * cfg.model.seq_len;
  if (root) {
    const auto& m = cfg.model;
    std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %d heads), %lld tokens/step (%d x %d x %d sequences "
                "of %d), %s, %d steps; %d ranks: %d stages (%s%s) x %d data-parallel\n",
                preset_of(m).c_str(), m.arch.c_str(), m.layers, m.hidden, m.heads,
                static_cast<long long>(tokens), p.data_parallel, p.micro_batches, p.micro_batch_size, m.seq_len,
                optimizer_of(cfg).c_str(), cfg.train.steps, world.size(), p.stages, layout.schedule.name.c_str(),
                layout.stages() != p.stages ? fmt::format(", {} model chunks", layout.stages()).c_str() : "",
                p.data_parallel);
    const std::string shared = exec.kfac_distributed_line();
    if (!shared.empty()) std::printf("%s\n", shared.c_str());
    std::fflush(stdout);
  }

  const LrSchedule lr = make_run_lr_schedule(cfg);  // K-FAC's own warm-up, as the Trainer
  std::vector<ActionTime> times;
  auto t0 = std::chrono::steady_clock::now();
  double valid = 0, step_time_sum = 0;  // step times after the first two (dkfac.json)
  int timed_steps = 0;
  const std::string ckpt_dir = checkpoint_dir_of(cfg);
  // Collective. Rank 0 makes the step directory; the ranks holding pipeline 0 of replica 0 write
  // their stages (with K-FAC, factors and inverses in the single-process format), every rank its
  // K-FAC state (kfac-rank-R); rank 0 gathers the files' checksums and commits the manifest, then `latest`.
  auto save_checkpoint = [&](int64_t steps_done) {
    const std::string step_dir = checkpoint_step_dir(ckpt_dir, steps_done);
    comm::on_root_agreed(world.rank(), [&] {
      remove_checkpoint(step_dir);  // an interrupted earlier attempt at this step
      make_dirs(step_dir, "train.checkpoint_dir");
    });
    nlohmann::json mine = nlohmann::json::array();
    std::string err;  // this rank's write error (a full disk)
    try {
      if (groups.replica == 0)
        for (auto& c : exec.chunk_states())
          if (c.pipeline == 0)
            for (const CheckpointFile& f : write_stage_state(step_dir, c.stage, c.state))
              mine.push_back({f.name, f.bytes, f.sha256});
      for (const CheckpointFile& f : exec.write_kfac_state(step_dir)) mine.push_back({f.name, f.bytes, f.sha256});
    } catch (const UsageError& e) {
      err = e.what();
    }
    const auto all = comm::gather_bytes(err.empty() ? "F" + mine.dump() : "E" + err, 0, MPI_COMM_WORLD);
    comm::on_root_agreed(world.rank(), [&] {
      try {
        CheckpointManifest m{steps_done, checkpoint_info(cfg, steps_done, layout_name), {}};
        for (const std::string& r : all) {
          if (r[0] == 'E') throw UsageError(r.substr(1));
          for (const auto& f : nlohmann::json::parse(r.substr(1)))
            m.files.push_back({f[0].get<std::string>(), f[1].get<uint64_t>(), f[2].get<std::string>()});
        }
        commit_checkpoint(ckpt_dir, m, cfg.train.keep_checkpoints);
      } catch (const UsageError& e) {
        // The partial directory goes; the previous checkpoint stays the newest.
        remove_checkpoint(step_dir);
        throw UsageError(fmt::format("{} (the checkpoint after step {} was not written); {}", e.what(), steps_done,
                                     last_checkpoint_note(ckpt_dir)));
      }
    });
    comm::checkpoint_written();
  };
  install_stop_signals();
  // A write error of rank 0 (log, profile: a full disk) stops every rank after the step, exit 2.
  std::string write_error;
  comm::StepsRunning running;
  for (int64_t s = first_step; s < cfg.train.steps; ++s) {
    comm::monitor_step(s);
    auto ts = std::chrono::steady_clock::now();
    StepStats st;
    st.step = s;
    fill_step(*train_data, s, p.micro_batch_size, mbs);
    test_poison_step(s, mbs);  // TEST HOOK: no-op unless PF_TEST_POISON_STEP is set
    st.lr = lr.at(s);
    const bool prof = profiler.wants(s);
    StepOutcome o = exec.step(s, mbs, st.lr, prof ? &times : nullptr);
    st.loss = o.loss;
    st.grad_norm = o.grad_norm;
    st.kfac_curvature = o.kfac_curvature > 0;
    st.kfac_inversion = o.kfac_inversion > 0;
    st.kfac_time_s = o.kfac_time_s;
    st.kfac_raised = -1;
    // Every rank has the same loss (world sum) and norm (pipeline sum of all-reduced gradients); a
    // non-finite norm made every optimizer skip its update (optim/optimizer.hpp).
    st.nonfinite = !std::isfinite(o.loss) || !std::isfinite(o.grad_norm);
    if (st.nonfinite) {
      if (root)
        std::fprintf(stderr, "step %lld: non-finite %s (loss %g, gradient norm %g): no update%s\n",
                     static_cast<long long>(s + 1), std::isfinite(o.loss) ? "gradient" : "loss", o.loss, o.grad_norm,
                     cfg.train.on_nonfinite == "stop" ? "; stopping (train.on_nonfinite = stop)" : ", step skipped");
      if (cfg.train.on_nonfinite == "stop") return 1;
    }
    st.tokens = tokens;
    st.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (s >= 2) step_time_sum += st.step_time_s, ++timed_steps;
    if (prof) {
      try {
        std::vector<Action> actions = exec.step_actions(s);
        std::vector<ActionTime> stamps = times;
        exec.expand_inline_units(actions, stamps);  // an inline refresh as its units, not one PREC
        profiler.record(s, stamps, actions);         // collective; rank 0 writes
      } catch (const UsageError& e) {
        if (write_error.empty()) write_error = e.what();
      }
    }
    std::optional<double> v;
    if (s + 1 == cfg.train.steps || (cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0))
      v = valid = exec.evaluate(*valid_data);
    if (root && write_error.empty()) {
      try {
        log->step(st, v);
      } catch (const UsageError& e) {
        write_error = e.what();
      }
    }
    // SIGINT/SIGTERM reach the ranks at different moments: they agree to stop after the step in
    // which any of them saw one; and on a write error of rank 0.
    double flags[2] = {static_cast<double>(stop_signal()), write_error.empty() ? 0.0 : 1.0};
    comm::allreduce_sum(flags, MPI_COMM_WORLD, "the stop flags");
    if (flags[1] > 0)
      throw UsageError(fmt::format("{}; {}", write_error.empty() ? "a write error on rank 0" : write_error,
                                   last_checkpoint_note(ckpt_dir)));
    const double sig = flags[0];
    const bool periodic = !cfg.train.checkpoint_dir.empty() && cfg.train.checkpoint_every > 0 &&
                          (s + 1) % cfg.train.checkpoint_every == 0;
    if (periodic || sig > 0) save_checkpoint(s + 1);
    if (sig > 0) {
      const int signo = stop_signal() ? stop_signal() : SIGTERM;
      if (root)
        std::fprintf(stderr, "pipefisher train: %s after step %lld: checkpoint written to %s; continue with --resume %s\n",
                     signal_name(signo), static_cast<long long>(s + 1), checkpoint_step_dir(ckpt_dir, s + 1).c_str(),
                     ckpt_dir.c_str());
      return 128 + signo;
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::unique_ptr<Model> model = exec.gather_model();
  const std::string activations = activation_memory_json(exec, groups, MPI_COMM_WORLD);
  // Rank 0's write errors here (collectives inside) are agreed on below, so every rank exits 2.
  try {
    if (cfg.kfac.enabled) exec.write_kfac_record(out + "/kfac_refresh.json");
    exec.write_dkfac_record(out + "/dkfac.json", step_time_sum, timed_steps);
    profiler.finish(exec.plan_profile_json(), exec.kfac_stage_costs());
  } catch (const UsageError& e) {
    write_error = e.what();
  }
  comm::on_root_agreed(world.rank(), [&] {
    if (!write_error.empty()) throw UsageError(write_error);
    std::vector<const Param*> params;
    for (Param* q : model->params()) params.push_back(q);
    require_finite(params, out + "/model.safetensors");
    save_hf_model(out, params, cfg.model);
    if (!a.save.empty()) save_trained_weights(a.save, params);
    write_file_atomic(out + "/summary.json", log->summary(valid, wall));
    write_file_atomic(out + "/activations.json", activations);
    std::printf("outputs: %s/{config.toml, log.jsonl, metrics.csv, model.safetensors, config.json, summary.json, "
                "activations.json%s}%s\n", out.c_str(), exec.kfac_distributed_line().empty() ? "" : ", dkfac.json",
                a.save.empty() ? "" : (", " + a.save).c_str());
  });
  return 0;
}

}  // namespace

int launcher_world_size() { return std::max(1, env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1)); }
int launcher_rank() { return std::max(0, env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0)); }
int launcher_local_size() { return std::max(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", 1)); }

int run_parallel_training(Config cfg, const ParallelRunArgs& args) {
  comm::World world;
  try {
    require_one_configuration(cfg, args, world.rank());  // MPMD launches may differ: before anything else
    // Memory and threads of the ranks on this host, before anything is allocated.
    check_resources(cfg, launcher_local_size(), world.size());
    const std::string ckpt_dir = checkpoint_dir_of(cfg);
    comm::RankMonitor monitor(world, [ckpt_dir] { return last_checkpoint_note(ckpt_dir); });
    return train(world, std::move(cfg), args);
  } catch (const UsageError&) {
    if (world.rank() == 0) throw;
    return 2;  // rank 0 says it
  }
}

}  // namespace pf
