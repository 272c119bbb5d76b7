#include "runtime/train_run.hpp"

#include "comm/collectives.hpp"
#include "comm/world.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "optim/lr_schedule.hpp"
#include "runtime/executor.hpp"
#include "runtime/layout.hpp"
#include "schedule/validate.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <algorithm>
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

// Runs `fn` on world rank 0 only; a UsageError it throws is thrown on every rank (rank 0's
// message travels by broadcast), so no rank is left waiting in a collective.
void on_root_agreed(const comm::World& world, const std::function<void()>& fn) {
  std::string err;
  if (world.rank() == 0) {
    try {
      fn();
    } catch (const UsageError& e) {
      err = e.what();
    }
  }
  uint64_t n = err.size();
  comm::broadcast_bytes(&n, sizeof n, 0, MPI_COMM_WORLD);
  err.resize(n);
  if (n) comm::broadcast_bytes(err.data(), n, 0, MPI_COMM_WORLD);
  if (n) throw UsageError(err);
}

// Threads per rank: train.threads, or the cores shared among the ranks on this host.
int threads_per_rank(const Config& cfg) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  MPI_Comm local = MPI_COMM_NULL;
  comm::check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
              "MPI_Comm_split_type");
  comm::Comm owned(local);
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, cores / owned.size());
}

int train(const comm::World& world, Config cfg, const ParallelRunArgs& a) {
  const bool root = world.rank() == 0;
  Layout layout;
  try {
    layout = make_layout(cfg, world.size());
  } catch (const ScheduleError& e) {
    if (root) std::fprintf(stderr, "%s", e.grid.c_str());
    throw;
  }
  cfg.check_files();
  if (!a.init.empty() && !std::filesystem::is_regular_file(a.init)) usage_error("--init", "no such file '{}'", a.init);
  comm::Groups groups = comm::make_groups(world, cfg.parallel.stages, cfg.parallel.data_parallel);
  set_threads(threads_per_rank(cfg));

  const ParallelConfig& p = cfg.parallel;
  auto train_data = make_batcher(cfg.model, cfg.data, false);
  auto valid_data = make_batcher(cfg.model, cfg.data, true);
  Executor exec(cfg, layout, groups);
  if (!a.init.empty()) exec.load(a.init);
  Profiler profiler(cfg, layout, groups, exec, a.profile);

  // Rank 0's outputs, prepared before the first step so a bad path fails every rank now.
  const std::string& out = cfg.train.out_dir;
  std::unique_ptr<RunLog> log;
  on_root_agreed(world, [&] {
    make_dirs(out, "train.out_dir");
    write_file_atomic(out + "/config.toml", cfg.to_toml());
    std::vector<std::string> logs{out + "/log.jsonl"};
    if (!cfg.train.log_json.empty()) logs.push_back(cfg.train.log_json);
    log = std::make_unique<RunLog>(cfg.train.steps, cfg.train.log_every, logs);
  });

  std::vector<MicroBatch> mbs(static_cast<size_t>(p.data_parallel) * p.micro_batches);
  for (MicroBatch& mb : mbs) mb.resize(p.micro_batch_size, cfg.model.seq_len);
  const int64_t tokens = static_cast<int64_t>(mbs.size()) * p.micro_batch_size * cfg.model.seq_len;
  if (root) {
    const auto& m = cfg.model;
    std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %d heads), %lld tokens/step (%d x %d x %d sequences "
                "of %d), %s, %d steps; %d ranks: %d stages (%s%s) x %d data-parallel\n",
                m.preset.empty() ? "custom" : m.preset.c_str(), m.arch.c_str(), m.layers, m.hidden, m.heads,
                static_cast<long long>(tokens), p.data_parallel, p.micro_batches, p.micro_batch_size, m.seq_len,
                cfg.optim.name.c_str(), cfg.train.steps, world.size(), p.stages, layout.schedule.name.c_str(),
                layout.stages() != p.stages ? fmt::format(", {} model chunks", layout.stages()).c_str() : "",
                p.data_parallel);
    std::fflush(stdout);
  }

  const LrSchedule lr = make_lr_schedule(cfg.optim, cfg.train.steps);
  std::vector<ActionTime> times;
  auto t0 = std::chrono::steady_clock::now();
  double valid = 0;
  for (int s = 0; s < cfg.train.steps; ++s) {
    auto ts = std::chrono::steady_clock::now();
    StepStats st;
    st.step = s;
    fill_step(*train_data, s, p.micro_batch_size, mbs);
    st.lr = lr.at(s);
    const bool prof = profiler.wants(s);
    StepOutcome o = exec.step(s, mbs, st.lr, prof ? &times : nullptr);
    st.loss = o.loss;
    st.grad_norm = o.grad_norm;
    st.tokens = tokens;
    st.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (prof) profiler.record(s, times);
    std::optional<double> v;
    if (s + 1 == cfg.train.steps || (cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0))
      v = valid = exec.evaluate(*valid_data);
    if (root) log->step(st, v);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::unique_ptr<Model> model = exec.gather_model();
  profiler.finish();
  if (root) {
    std::vector<const Param*> params;
    for (Param* q : model->params()) params.push_back(q);
    save_safetensors(out + "/model.safetensors", params);
    if (!a.save.empty()) save_safetensors(a.save, params);
    write_file_atomic(out + "/summary.json", log->summary(valid, wall));
    std::printf("outputs: %s/{config.toml, log.jsonl, model.safetensors, summary.json}%s\n", out.c_str(),
                a.save.empty() ? "" : (", " + a.save).c_str());
  }
  return 0;
}

}  // namespace

int launcher_world_size() { return std::max(1, env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1)); }
int launcher_rank() { return std::max(0, env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0)); }

int run_parallel_training(Config cfg, const ParallelRunArgs& args) {
  comm::World world;
  try {
    return train(world, std::move(cfg), args);
  } catch (const UsageError&) {
    if (world.rank() == 0) throw;
    return 2;  // rank 0 says it
  }
}

}  // namespace pf
