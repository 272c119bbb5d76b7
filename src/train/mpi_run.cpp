#include "train/mpi_run.hpp"

#include "comm/collectives.hpp"
#include "comm/rank_monitor.hpp"
#include "comm/small.hpp"
#include "comm/world.hpp"
#include "config/limits.hpp"
#include "config/placement.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "optim/lr_schedule.hpp"
#include "runtime/executor.hpp"
#include "runtime/kfac_checkpoint.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
#include "runtime/plan_record.hpp"
#include "runtime/pipefisher/controller.hpp"
#include "runtime/pipefisher/pipefisher_options.hpp"
#include "runtime/profiler.hpp"
#include "runtime/units/inline_placement.hpp"
#include "runtime/soap/soap_placement.hpp"
#include "runtime/soap/soap_record_placement.hpp"
#include "runtime/units/kfac_units.hpp"
#include "schedule/validate.hpp"
#include "train/checkpointing.hpp"
#include "train/config_agreement.hpp"
#include "train/train_engine.hpp"
#include "train/train_loop.hpp"
#include "train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>

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
                           {"input_bytes", st.input_bytes},
                           {"deferred_bytes", st.deferred_bytes}});
  const std::vector<std::string> all = comm::gather_bytes(j.dump(), 0, world);
  if (all.empty()) return "";
  nlohmann::json out{{"recompute", m.recompute}, {"ranks", nlohmann::json::array()}};
  int64_t worst = 0;
  for (const std::string& r : all) {
    out["ranks"].push_back(nlohmann::json::parse(r));
    worst = std::max(worst, out["ranks"].back()["peak_bytes"].get<int64_t>());
  }
  if (worst == 0)  // a run resumed at its end: only the final evaluation ran here
    std::printf("activation memory: no training step ran in this segment of the run\n");
  else
    std::printf("activation memory: at most %.3f MB held at once on a device (parallel.recompute = %s)\n",
                worst / 1e6, m.recompute ? "true" : "false");
  return out.dump(2) + "\n";
}

// The placement of precond.placement (runtime/kfac_placement.hpp), built from its spec
// (config/placement.hpp): PipeFisher's controller, its steps run in order (bubbles) or filling the
// waits (adaptive); the inline list otherwise.
std::unique_ptr<KfacPlacement> make_placement(const PlacementSpec& spec, const Config& cfg, const Layout& layout,
                                              const comm::Groups& groups, KfacUnits& units, const KfacSeams& seams) {
  if (!spec.planned) return std::make_unique<InlinePlacement>(inline_options(cfg.kfac), layout, groups.stage, units);
  std::unique_ptr<StepDriver> driver;
  if (spec.fills_waits) driver = std::make_unique<FillingWaits>();
  else driver = std::make_unique<InOrder>();
  return std::make_unique<Controller>(pipefisher_options(cfg, layout), std::move(driver), layout, groups, units, seams);
}

// The training engine of an MPI job (train/train_engine.hpp): this rank's stages in an Executor;
// with K-FAC, its units (the executor's K-FAC handlers) and the placement choosing each step's list.
class MpiEngine final : public TrainEngine {
 public:
  // `ranks`: the layout's (the world's size, or more for a --dry-run in one process).
  MpiEngine(const comm::World& world, int ranks, const Config& cfg, ProfileOptions profile, const TestSeams& seams);

  bool root() const override { return world_.rank() == 0; }
  void on_root(const std::function<void()>& fn) override { comm::on_root_agreed(world_.rank(), fn); }
  void sum(std::span<double> values) override { comm::allreduce_sum(values, MPI_COMM_WORLD, "the stop flags"); }
  std::vector<std::string> gather(const std::string& mine) override { return comm::gather_bytes(mine, 0, MPI_COMM_WORLD); }
  void steps_running(bool on) override {
    if (on) running_ = std::make_unique<comm::StepsRunning>();
    else running_.reset();
  }
  void checkpoint_written() override { comm::checkpoint_written(); }

  std::string layout_name() const override { return layout_name_; }
  bool builds_here() const override { return world_.size() == layout_.devices * layout_.replicas; }
  void build(const Config& cfg) override;
  void load_init(const std::string& init, const CheckpointReader* ckpt) override;
  void load_resume(const CheckpointReader& r) override;
  void open_outputs() override;
  EngineBanner banner() const override;

  EngineStep step(int64_t step) override;
  std::optional<double> evaluate(const StopAsked& stopped) override { return exec_->evaluate(*valid_data_, stopped); }
  std::vector<CheckpointFile> write_checkpoint(const std::string& step_dir) override;
  FinalRecords finish(const std::string& out_dir) override;

 private:
  std::vector<int64_t> gather_stage_parameters();
  // Collective: fn on every rank; the first rank's UsageError (in rank order) is thrown on all.
  void agreed(const std::function<void()>& fn);
  void record_profile(int64_t step, std::string& write_error);
  StepOutcome run_step(int64_t step, double lr, bool profiled);

  const comm::World& world_;
  Config cfg_;
  Layout layout_;
  std::string layout_name_;
  ProfileOptions profile_opt_;
  TestSeams seams_;  // tests only (train/test_seams.hpp): the poison to the executor, K-FAC's to the controller
  comm::Groups groups_;
  std::unique_ptr<Batcher> train_data_, valid_data_;
  std::unique_ptr<Executor> exec_;
  // K-FAC (null without): after exec_, so destroyed before it (the units hold its chunk records,
  // whose K-FAC parts they made).
  std::unique_ptr<KfacUnits> kfac_units_;
  std::unique_ptr<KfacPlacement> placement_;
  SoapPlacement* soap_ = nullptr;  // placement_ when SOAP's refreshes run in the bubbles
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<comm::StepsRunning> running_;
  std::unique_ptr<Model> model_;  // the gathered final model (rank 0)
  std::vector<int64_t> stage_parameters_;  // rank 0's: by stage, of pipeline 0 of replica 0
  std::vector<MicroBatch> mbs_;
  LrSchedule lr_;
  std::vector<ActionTime> times_;
  // A profiled step's list and the plan's timeline of it, taken before the placement's step end
  // (after_step moves the placement to the next step's phase).
  std::vector<Action> profiled_actions_;
  std::vector<TimedAction> profiled_row_;
  int64_t last_step_ = 0;     // the refresh record's length: last_step_ + 1
  double step_time_sum_ = 0;  // step times after the first two (dkfac.json)
  int timed_steps_ = 0;
};

MpiEngine::MpiEngine(const comm::World& world, int ranks, const Config& cfg, ProfileOptions profile,
                     const TestSeams& seams)
    : world_(world), cfg_(cfg), profile_opt_(std::move(profile)), seams_(seams) {
  check_kfac_placement(cfg, KfacRunner::mpi);
  try {
    layout_ = make_layout(cfg, ranks);
  } catch (const ScheduleError& e) {
    if (root()) std::fprintf(stderr, "%s", e.grid.c_str());
    throw;
  }
  const ParallelConfig& p = cfg.parallel;
  layout_name_ = fmt::format("{} stages ({}) x {} data-parallel", p.stages, layout_.schedule.name, p.data_parallel);
  check_profile_steps(profile_opt_, cfg.train.steps);
  // The controller's options (a recorded profile read) when built; refused here too, for a
  // --dry-run that builds nothing.
  if (cfg.kfac.enabled && placement_spec(cfg.kfac).planned) pipefisher_options(cfg, layout_);
}

void MpiEngine::build(const Config& cfg) {
  cfg_ = cfg;
  const ParallelConfig& p = cfg.parallel;
  groups_ = comm::make_groups(world_, p.stages, p.data_parallel);
  set_threads(comm::threads_per_rank(cfg.train.threads));
  train_data_ = make_batcher(cfg.model, cfg.data, false);
  valid_data_ = make_batcher(cfg.model, cfg.data, true);
  exec_ = std::make_unique<Executor>(cfg_, layout_, groups_, seams_.poison);
  exec_->set_noise(seams_.noise);
  if (cfg_.kfac.enabled) {
    const PlacementSpec spec = placement_spec(cfg_.kfac);
    kfac_units_ = std::make_unique<KfacUnits>(cfg_, layout_, groups_, exec_->hosted(),
                                              spec.planned ? KfacService::Refresh::units : KfacService::Refresh::whole);
    placement_ = make_placement(spec, cfg_, layout_, groups_, *kfac_units_, seams_.kfac);
    exec_->set_kfac(kfac_units_.get());
  } else if (cfg_.optim.name == OptimName::Soap && placement_spec(cfg_.kfac).planned) {
    // SOAP's refreshes as the graph's units, placed by the same planner (no K-FAC handlers).
    auto soap = std::make_unique<SoapPlacement>(cfg_, layout_, groups_, exec_->hosted(), seams_.kfac.cost_scale);
    soap_ = soap.get();
    placement_ = std::move(soap);
  } else if (cfg_.optim.name == OptimName::Soap && placement_spec(cfg_.kfac).replays) {
    placement_ = std::make_unique<SoapRecordPlacement>(cfg_, layout_, groups_, exec_->hosted());
  }
  mbs_.resize(static_cast<size_t>(p.data_parallel) * p.micro_batches);
  for (MicroBatch& mb : mbs_) mb.resize(p.micro_batch_size, cfg.model.seq_len);
  lr_ = make_run_lr_schedule(cfg);
  stage_parameters_ = gather_stage_parameters();  // K-FAC's own warm-up, as the Trainer
}

void MpiEngine::agreed(const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const UsageError& e) {
    err = e.what();
  }
  const std::vector<std::string> all = comm::gather_bytes(err, 0, MPI_COMM_WORLD);
  comm::on_root_agreed(world_.rank(), [&] {
    for (const std::string& e : all)
      if (!e.empty()) throw UsageError(e);
  });
}

void MpiEngine::load_init(const std::string& init, const CheckpointReader* ckpt) {
  agreed([&] {
    if (ckpt) {
      for (const HostedChunk& c : exec_->hosted()) ckpt->load_params(c.params);
    } else if (!init.empty()) {
      exec_->load(init);
    }
  });
}

void MpiEngine::load_resume(const CheckpointReader& r) {
  agreed([&] {
    // K-FAC: this rank's own copy, below (replicas and twins differ mid-cycle).
    for (const HostedChunk& c : exec_->hosted()) load_train_state(r, {c.params, c.optim.get(), nullptr});
  });
  if (kfac_units_) load_kfac_state(r, groups_.rank, cfg_, *kfac_units_, *placement_);
  if (soap_) agreed([&] { load_soap_state(r, groups_.rank, cfg_, *soap_); });
}

void MpiEngine::open_outputs() {
  profiler_ = std::make_unique<Profiler>(cfg_, layout_, groups_, *exec_,
                                         kfac_units_ ? kfac_units_->layer_names() : Profiler::KfacLayerNames{},
                                         profile_opt_);
}

// Collective: each stage's parameter count at rank 0, from the ranks of replica 0 that host
// pipeline 0's chunks (Chimera's second pipeline holds copies).
std::vector<int64_t> MpiEngine::gather_stage_parameters() {
  std::string mine;
  if (groups_.replica == 0)
    for (const HostedChunk& c : exec_->hosted())
      if (c.pipeline == 0) mine += fmt::format("{} {} ", c.stage, parameter_count(*c.model));
  std::vector<int64_t> counts(static_cast<size_t>(layout_.stages()), 0);
  for (const std::string& s : comm::gather_bytes(mine, 0, MPI_COMM_WORLD)) {
    std::istringstream in(s);
    for (int stage = 0; in >> stage;) in >> counts.at(static_cast<size_t>(stage));
  }
  return counts;
}

EngineBanner MpiEngine::banner() const {
  const ParallelConfig& p = cfg_.parallel;
  EngineBanner b;
  b.layout = fmt::format("; {} rank{}: {} stages ({}{}) x {} data-parallel", world_.size(), world_.size() == 1 ? "" : "s",
                         p.stages,
                         layout_.schedule.name,
                         layout_.stages() != p.stages ? fmt::format(", {} model chunks", layout_.stages()) : "",
                         p.data_parallel);
  const std::string shared = kfac_units_ ? kfac_units_->distributed_line() : "";
  if (!shared.empty()) b.notes.push_back(shared);
  if (exec_) b.stage_parameters = stage_parameters_;
  return b;
}

EngineStep MpiEngine::step(int64_t s) {
  comm::monitor_step(s);
  const auto t0 = std::chrono::steady_clock::now();
  EngineStep r;
  StepStats& st = r.stats;
  st.step = s;
  fill_step(*train_data_, s, cfg_.parallel.micro_batch_size, mbs_);
  seams_.poison.poison_inputs(s, mbs_);
  st.lr = lr_.at(s);
  const bool prof = profiler_->wants(s);
  const StepOutcome o = run_step(s, st.lr, prof);
  st.loss = o.loss;
  st.grad_norm = o.grad_norm;
  if (cfg_.kfac.enabled) st.precond_grad_norm = o.precond_grad_norm;
  st.kfac_curvature = o.kfac_curvature > 0;
  st.kfac_inversion = o.kfac_inversion > 0;
  st.kfac_time_s = o.kfac_time_s;
  st.kfac_raised = -1;
  // Every rank has the same loss (world sum) and norm (pipeline sum of all-reduced gradients); a
  // non-finite norm made every optimizer skip its update (optim/optimizer.hpp).
  st.nonfinite = !std::isfinite(o.loss) || !std::isfinite(o.precond_grad_norm);
  st.tokens = static_cast<int64_t>(mbs_.size()) * cfg_.parallel.micro_batch_size * cfg_.model.seq_len;
  st.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s >= 2) step_time_sum_ += st.step_time_s, ++timed_steps_;
  if (prof) record_profile(s, r.write_error);
  return r;
}

// The step's list from the placement (the lowered schedule without K-FAC), run by the executor,
// then handed back to the placement with its stamps.
StepOutcome MpiEngine::run_step(int64_t s, double lr, bool profiled) {
  last_step_ = s;
  if (!placement_) {
    if (profiled) profiled_actions_ = exec_->actions(), profiled_row_.clear();
    return exec_->run(s, exec_->actions(), mbs_, lr, profiled ? &times_ : nullptr);
  }
  const std::vector<Action>& list = placement_->actions_for(s);
  if (profiled) profiled_actions_ = list, profiled_row_ = placement_->planned_row(s);
  const bool stamps = placement_->begin_step(s, mbs_);
  const StepOutcome o = exec_->run(s, list, mbs_, lr, stamps || profiled ? &times_ : nullptr, placement_->driver());
  placement_->after_step(s, list, stamps || profiled ? times_ : std::vector<ActionTime>{});
  return o;
}

void MpiEngine::record_profile(int64_t s, std::string& write_error) {
  try {
    std::vector<Action> actions = profiled_actions_;
    std::vector<ActionTime> stamps = times_;
    if (kfac_units_) kfac_units_->expand_inline_units(actions, stamps);  // an inline refresh as its units, not one PREC
    // Collective; rank 0 writes. With the plan's timeline of the step (none outside a plan).
    profiler_->record(s, stamps, actions, profiled_row_);
  } catch (const UsageError& e) {
    write_error = e.what();
  }
}

// Rank 0 makes the step directory (the loop); the ranks holding pipeline 0 of replica 0 write
// their stages (with K-FAC, factors and inverses in the single-process format), every rank its
// K-FAC state (kfac-rank-R).
std::vector<CheckpointFile> MpiEngine::write_checkpoint(const std::string& step_dir) {
  std::vector<CheckpointFile> files;
  if (groups_.replica == 0)
    for (const HostedChunk& c : exec_->hosted())
      if (c.pipeline == 0) {
        KfacPreconditioner* kfac = kfac_units_ ? kfac_units_->preconditioner(c.pipeline, c.stage) : nullptr;
        for (const CheckpointFile& f : write_stage_state(step_dir, c.stage, {c.params, c.optim.get(), kfac}))
          files.push_back(f);
      }
  if (kfac_units_)
    for (const CheckpointFile& f : write_kfac_state(step_dir, groups_.rank, cfg_, *kfac_units_, *placement_))
      files.push_back(f);
  if (soap_)
    for (const CheckpointFile& f : write_soap_state(step_dir, groups_.rank, cfg_, *soap_)) files.push_back(f);
  return files;
}

FinalRecords MpiEngine::finish(const std::string& out) {
  FinalRecords r;
  model_ = exec_->gather_model();
  const std::string activations = activation_memory_json(*exec_, groups_, MPI_COMM_WORLD);
  if (placement_) placement_->driver().print_summary(root());  // collective (adaptive: where its units ran)
  // Rank 0's write errors here (collectives inside) are agreed on by the loop.
  try {
    if (soap_) soap_->write_refresh_record(out + "/soap_refresh.json", last_step_ + 1);
    if (kfac_units_) {
      kfac_units_->write_refresh_record(out + "/kfac_refresh.json", last_step_ + 1, placement_->plan_start(),
                                        placement_->plan_period());
      kfac_units_->write_dkfac_record(out + "/dkfac.json", step_time_sum_, timed_steps_);
    }
    profiler_->finish(placement_ ? placement_->plan_profile() : nullptr);
  } catch (const UsageError& e) {
    r.write_error = e.what();
  }
  if (!model_) return r;
  if (placement_) r.plan = placement_->plan_summary();
  for (const Param* q : model_->params()) r.params.push_back(q);
  r.files.emplace_back("activations.json", activations);
  r.listed.push_back("activations.json");
  if (cfg_.kfac.enabled) r.listed.push_back("kfac_refresh.json");
  if (soap_) r.listed.push_back("soap_refresh.json");
  if (soap_ && placement_spec(cfg_.kfac).planned) r.listed.push_back("soap_profile.json");
  if (cfg_.kfac.enabled && placement_spec(cfg_.kfac).planned) r.listed.push_back("kfac_profile.json");
  if (kfac_units_ && !kfac_units_->distributed_line().empty()) r.listed.push_back("dkfac.json");
  return r;
}

}  // namespace

int launcher_world_size() { return std::max(1, env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", 1)); }
int launcher_rank() { return std::max(0, env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", 0)); }
int launcher_local_size() { return std::max(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", 1)); }

namespace {
// How long a refusing rank waits for the others (they refuse within milliseconds of each other).
constexpr double kRefusalWaitSeconds = 5;

// A refusal ends every rank with exit 2 and one line, rank 0's: it writes the line before the
// ranks part, since mpirun ends the job as soon as one rank has exited nonzero. A rank whose
// refusal rank 0 does not share (a file missing on its host) says it itself, naming its rank.
void refuse_together(const comm::World& world, const UsageError& e) {
  if (world.rank() == 0) {
    std::fprintf(stderr, "pipefisher: %s\n", e.what());
    std::fflush(stderr);
  }
  if (!comm::barrier_within(MPI_COMM_WORLD, kRefusalWaitSeconds) && world.rank() != 0)
    std::fprintf(stderr, "pipefisher: rank %d: %s\n", world.rank(), e.what());
}
}  // namespace

int run_parallel_training(Config cfg, const TrainRunArgs& args, std::set<int> profile_steps) {
  comm::World world;
  try {
    require_one_configuration(cfg, args, world.rank());  // MPMD launches may differ: before anything else
    // --dry-run without mpirun checks the layout as launched with the ranks it needs, on this host.
    const bool preview = args.dry_run && launcher_world_size() == 1;
    const int ranks = preview ? cfg.parallel.stages * cfg.parallel.data_parallel : world.size();
    // Memory and threads of the ranks on this host, before anything is allocated.
    check_resources(cfg, preview ? ranks : launcher_local_size(), ranks);
    const std::string ckpt_dir = checkpoint_dir_of(cfg);
    comm::RankMonitor monitor(world, [ckpt_dir] { return last_checkpoint_note(ckpt_dir); },
                              args.seams.oom_counter.empty() ? "/proc/vmstat" : args.seams.oom_counter);
    MpiEngine engine(world, ranks, cfg, {args.profile_dir, std::move(profile_steps)}, args.seams);
    return run_training(engine, std::move(cfg), args);
  } catch (const UsageError& e) {
    refuse_together(world, e);
    return 2;
  }
}

}  // namespace pf
