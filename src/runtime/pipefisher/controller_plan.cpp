// PipeFisher's controller, planning (controller.hpp): the all-reduced profile (or the recorded one)
// into the planner, the plan's splits and precondition splits applied, its lines printed.
#include "runtime/pipefisher/controller.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "kfac/factor.hpp"
#include "kfac/kfac_layer.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <tuple>

namespace pf {

namespace {
// The plan's input as saved: its profile JSON (runtime/plan_record.hpp), or the wire form's sums
// that checkpoints of earlier builds hold; empty without a plan.
PlanProfile saved_plan_input(const nlohmann::json& j, const nlohmann::json& shape, const Layout& layout,
                             const std::string& where) {
  if (j.is_object()) return read_profile(j, where).plan;
  if (!j.is_array() || j.empty()) return {};
  PlanProfile p = ProfileLayout(layout).mean(j.get<std::vector<double>>());
  p.shape = shape;
  return p;
}
}  // namespace

namespace {

// The plan's lines on stdout (rank 0): refresh steps, splits, inline work, the precondition,
// the inversion placement; `from` names the profile.
void print_plan(const KfacPlan& p, const PlanProfile& in, const std::string& from) {
  const std::string r = fmt::format("{}", fmt::join(p.refresh_steps, " "));
  std::printf("pipefisher: planned from %s: refresh every %s steps (per device), %zu split "
              "inversions, inline work %.3f ms per cycle, utilization %.0f%%, step %.2f ms (%.2f ms without K-FAC, "
              "%.2f ms with its precondition alone)\n",
              from.c_str(), r.c_str(), p.splits().size(), p.inline_time, 100 * p.utilization, p.step_time,
              p.plain_step_time, p.base_step_time);
  if (p.weight_gradients.total > 0) std::printf("pipefisher: %s (ms)\n", p.weight_gradients.line().c_str());
  std::printf("pipefisher: %s (ms)\n", p.precondition_line().c_str());
  if (!p.placements().empty()) {  // several holders: SPD-KFAC's Algorithm 1 over each stage's holders
    int ct = 0, pieces = 0;
    for (const StagePlacement& sp : p.placements())  // Chimera's twins hold the same placement: count it once
      if (sp.pipeline == 0) ct += sp.placement.communicated(), pieces += static_cast<int>(sp.pieces.size());
    std::printf("pipefisher: inversion pieces: %d broadcast, %d inverted on every holder (broadcast model %.4g ms + "
                "%.4g ms/byte)\n", ct, pieces - ct, std::max(0.0, in.bcast_alpha),
                std::max(0.0, in.bcast_beta));
  }
  std::fflush(stdout);
}

// One chunk's measured K-FAC units: the means of its timed samples, with its factors' sizes.
StageKfacCost measured_cost(const ChunkKfac& ck, const ChunkKfacTimes& t) {
  StageKfacCost c;
  c.precondition = t.prec / std::max(1, t.prec_samples);
  c.sync = t.sync / std::max(1, t.curv_samples);
  for (int l = 0; l < ck.layers(); ++l) {
    const ChunkKfac::LayerShape shape = ck.shape(l);
    c.curv_a.push_back(t.curv_a[l] / std::max(1, t.curv_samples));
    c.curv_b.push_back(t.curv_b[l] / std::max(1, t.curv_samples));
    c.inv_a.push_back(t.inv_a[l] / std::max(1, t.inv_samples));
    c.inv_b.push_back(t.inv_b[l] / std::max(1, t.inv_samples));
    c.dim_a.push_back(static_cast<int>(shape.dim_a));
    c.dim_b.push_back(static_cast<int>(shape.dim_b));
    c.diag_b.push_back(shape.diagonal_b ? 1 : 0);
  }
  return c;
}

}  // namespace

// The profiling steps' means: each pass at its kind's median on this device, each chunk's units
// as ChunkKfac timed them, the broadcast model when the profile has one (measured once).
Controller::RankTimes Controller::profiled_times() {
  const int W = layout_.replicas;
  const double samples = std::max(1, profile_.samples);
  RankTimes mine;
  mine.actions.assign(lowered_.size(), 0.0);
  for (size_t i = 0; i < lowered_.size(); ++i)
    if (planner_measures(lowered_[i].kind)) mine.actions[i] = profile_.action_ms[i] / samples / W;
  passes_at_their_median(lowered_, mine.actions);
  for (size_t c = 0; c < units_.hosted().size(); ++c)
    mine.chunks.push_back(measured_cost(units_.hosted()[c].kfac->chunk(), chunks_[c].profiled));
  if (ProfileLayout(layout_).broadcast) mine.bcast = bcast_model();  // every rank's model of its stage's broadcasts
  return mine;
}

// Every rank contributes its times to one all-reduce (runtime/plan_record.hpp's wire form): each
// stage's units are the mean over its holders, the broadcast model the mean over the ranks.
PlanProfile Controller::measured_profile(const RankTimes& mine, nlohmann::json shape, const char* what) const {
  const ProfileLayout wire(layout_);
  std::vector<double> v = wire.zeros();
  wire.set_actions(v, device_, mine.actions);
  for (size_t c = 0; c < units_.hosted().size(); ++c) wire.add_stage(v, units_.hosted()[c].stage, mine.chunks[c]);
  if (wire.broadcast) wire.add_broadcast(v, mine.bcast.first, mine.bcast.second);
  comm::allreduce_sum(v, MPI_COMM_WORLD, what);
  PlanProfile p = wire.mean(v);
  p.shape = std::move(shape);
  return p;
}

// At the profile's end (steps profile_start .. plan_start - 1) every rank plans from the same
// numbers (the same bits), so every rank gets the same plan, whose step 0 is plan_start.
void Controller::plan_from_profile(int64_t profile_start, int64_t plan_start) {
  const double samples = std::max(1, profile_.samples);
  planned_compute_ms_ = 0;
  for (size_t i = 0; i < lowered_.size(); ++i) {
    const Kind kd = lowered_[i].kind;
    if (kd != Kind::OPT && kd != Kind::ALLREDUCE && is_compute(kd)) planned_compute_ms_ += profile_.action_ms[i] / samples;
  }
  // This run's timings all-reduced, or (kfac.plan_profile) the same recorded numbers on every rank.
  plan_input_ = opts_.source->profile([&] {
    PlanProfile measured = measured_profile(profiled_times(), opts_.record.shape, "the K-FAC profile");
    return seams_.fixed_costs ? with_fixed_costs(std::move(measured)) : measured;
  });
  // Tests only: --test-kfac-cost-scale scales the measured K-FAC unit costs the planner sees (a
  // schedule with tiny bubbles, Chimera on 2 devices, then refreshes within a short test run).
  plan_scale_ = seams_.cost_scale;
  make_plan();
  profiled_refresh_ = plan_->refresh_steps;
  // Several holders per stage (replicas, Chimera's twins): from now on factors are committed at
  // SYNC_CURV and inverses travel with it.
  if (layout_.replicas > 1 || layout_.pipelines() > 1)
    for (HostedChunk& c : units_.hosted()) c.kfac->sync_as_planned();
  split_as_planned(plan_start);
  if (groups_.rank == 0) print_plan(*plan_, plan_input_, opts_.source->from(profile_start, plan_start));
  if (groups_.rank == 0)  // out_dir exists: rank 0 made it before the first step
    write_file_atomic(opts_.out_dir + "/kfac_profile.json", plan_profile_json(opts_.record, layout_, plan_input_).dump(1) + "\n");
}

// The plan from plan_input_ (the same bits on every rank): made at the end of a profile
// (plan_from_profile goes on), or remade from a checkpoint (the factors' block structure and the
// record come from the checkpoint, so nothing is recorded or printed).
void Controller::make_plan() {
  plan_ = plan_for(plan_input_, plan_scale_);
  split_preconditions();
}

// The planner over a profile (every rank the same bits, so every rank the same plan): the whole
// lowered step with its measured durations (the planner sets the optimizer steps aside and ends
// every list with them), the K-FAC units' costs times `scale` (tests only: not 1).
std::unique_ptr<KfacPlan> Controller::plan_for(const PlanProfile& prof, double scale) const {
  // No broadcast model: no broadcasts to model.
  PlanInput in = plan_input(layout_.schedule, opts_.settings, {std::max(0.0, prof.bcast_alpha), std::max(0.0, prof.bcast_beta)},
                            prof.kfac, scale);
  in.durations = prof.action_ms;
  return std::make_unique<KfacPlan>(plan_kfac(in));
}

// adaptive: `next`, planned from `input` (the steps measured since `since`), runs from step `at`,
// a cycle start of every device; returns the switching step's list. Its splits and inversion
// owners are the plan's (not_adaptable), so the factors keep their blocks and the previous
// cycle's inverses their broadcasts; the ended cycle's units wrapped into step `at` run first
// there, as in the steady state.
std::vector<Action> Controller::switch_plan(std::unique_ptr<KfacPlan> next, PlanProfile input, double scale,
                                            int64_t since, int64_t at) {
  const std::vector<int> was = plan_->refresh_steps;
  std::vector<Action> first = plan_->wrapped(groups_.replica, device_, 0);
  plan_ = std::move(next);
  plan_input_ = std::move(input);
  plan_scale_ = scale;
  const std::vector<Action>& step0 = plan_->actions(groups_.replica, device_, 0);
  first.insert(first.end(), step0.begin(), step0.end());
  split_preconditions();
  if (groups_.rank == 0)
    print_plan(*plan_, plan_input_,
               fmt::format("steps {}-{} as run (adaptive, was every {})", since + 1, at, fmt::join(was, " ")));
  return first;
}

// Broadcast of an inverse among a stage's holders (the planner's t_comm, ms and ms per byte):
// the comm performance model (comm/perf_model.hpp: measured once over this rank's first stage's
// holders, cached per machine), or --test-bcast-model (tests only: fixed numbers, so a test
// knows which pieces are broadcast).
std::pair<double, double> Controller::bcast_model() {
  if (seams_.bcast_model) return *seams_.bcast_model;
  if (!bcast_model_) {
    const comm::PerfModel& m = units_.perf_model();
    bcast_model_ = {m.broadcast.alpha * 1e3, m.broadcast.beta * 1e3 / sizeof(float)};  // s per float -> ms per byte
  }
  return *bcast_model_;
}

// The plan's precondition splits (PrecSplit), to each chunk's service.
void Controller::split_preconditions() {
  for (HostedChunk& c : units_.hosted()) c.kfac->split_precondition(plan_->prec_split(c.pipeline, c.stage), groups_);
}

// Block-diagonal factors as planned (a re-plan may also merge a factor back into one block).
void Controller::split_as_planned(int64_t plan_start) {
  for (HostedChunk& c : units_.hosted())
    for (int l = 0; l < c.kfac->chunk().layers(); ++l)
      for (int side : {0, 1}) {
        ChunkKfac& k = c.kfac->chunk();
        const int blocks = plan_->split_blocks(c.pipeline, c.stage, l, inversion_kind(side));
        if (k.blocks(l, side_at(side)) != blocks) k.split(l, side_at(side), blocks, plan_start);
      }
}

// The plan's period: the least common multiple of the devices' refresh cycles (0: no plan).
int Controller::plan_period() const {
  if (!plan_) return 0;
  int p = 1;
  for (int r : plan_->refresh_steps) p = std::lcm(p, std::max(r, 1));
  return p;
}

void Controller::save_plan(nlohmann::json& j) const {
  j["has_plan"] = static_cast<bool>(plan_);
  j["plan_input"] = plan_ ? plan_profile_json(opts_.record, layout_, plan_input_) : nlohmann::json();
  j["plan_scale"] = plan_scale_;
  j["profiled_compute"] = planned_compute_ms_;
}

// The plan in use, remade from the profile it was made from (timings of this run would give another).
void Controller::load_plan(const nlohmann::json& j, const std::string& where) {
  plan_input_ = saved_plan_input(j.at("plan_input"), opts_.record.shape, layout_, where + " plan_input");
  plan_scale_ = j.at("plan_scale").get<double>();
  planned_compute_ms_ = j.at("profiled_compute").get<double>();
  plan_.reset();
  if (j.at("has_plan").get<bool>()) make_plan();  // set_replicated and the blocks: ChunkKfac::load_state
  load_profiled_refresh(j);
}

// The profile's plan's cycles (adaptive's default bound; saved with the steady state, save_adapt).
void Controller::load_profiled_refresh(const nlohmann::json& j) {
  profiled_refresh_ = plan_ ? plan_->refresh_steps : std::vector<int>{};
  if (j.contains("adapt")) profiled_refresh_ = j.at("adapt").at("profiled_refresh").get<std::vector<int>>();
}

std::optional<PlanSummary> Controller::plan_summary() const {
  if (!plan_) return std::nullopt;
  return PlanSummary{.refresh_steps = plan_->refresh_steps, .step_ms = plan_->step_time,
                     .without_kfac_ms = plan_->plain_step_time, .precondition_only_ms = plan_->base_step_time,
                     .utilization = plan_->utilization};
}

}  // namespace pf
