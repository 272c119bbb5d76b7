// The PipeFisher planner (see planner.hpp for the rules) as a pipeline of passes over one
// PlanState (plan/plan_state.hpp), each reading what the earlier ones returned (run_pass stores
// each output; assemble builds the KfacPlan from them once):
//
//   set_aside_optimizer   the OPTs leave the step; they end every emitted list     plan_units.cpp
//                         (PlanState's constructor)
//   place_weight_gradients
//                         the step timed; zero-bubble W, in each device's order,
//                         into the earliest gap after its I that holds it          plan_w.cpp
//   split_precondition    a stage's precondition by layer over its holders         plan_prec.cpp
//   place_precondition    PREC per stage in the step's gaps or at its end: the
//                         base step                                                 plan_prec.cpp
//   make_units            curvature, curvature sync, inversion units per device;
//                         a stage's inversions over its group (SPD-KFAC Alg. 1),
//                         Chimera's twins x replicas, with BCAST_INV units          plan_units.cpp
//   build_cycle_step0     cycle step 0 per replica with its inline work            plan_units.cpp
//   pin_collectives       Chimera: the cycle step whose end holds the syncs (and
//                         with the group each pair's overlapped cycle)             plan_pack.cpp
//   pack_by_strategy      units into the bubbles of consecutive steps, the best
//                         of the strategies per device (split to shorten)          plan_pack.cpp
//   set_cycle_lengths     refresh period per device (or one for all)               plan_emit.cpp
//   emit_lists            placed units, splits, placements; per replica, device
//                         and cycle step the full action list (wrapped units,
//                         OPT last)                                                plan_emit.cpp
//   measure               bubble, lower bound, utilization, step time              plan_emit.cpp
//
// Where the next capability slots in. K-FAC units filled at run time into gaps the plan
// predicted: the plan already keeps its gaps (Timeline::gaps of `base`/`step0`) and each unit's
// gap (PlacedUnit); a pass after pack_by_strategy that marks units "deferred" would emit them as
// a per-gap queue instead of a fixed list position, and the runtime would drain that queue when
// it reaches the gap.
#include "plan/planner.hpp"

#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <tuple>

namespace pf {

namespace {

// Throws UsageError (naming the flag) for inconsistent input.
void check_input(const PlanInput& in) {
  const Schedule& sch = in.schedule;
  if (in.replicas < 1) usage_error("--data-parallel", "must be >= 1 (got {})", in.replicas);
  if (in.margin < 0) usage_error("--margin", "must be >= 0 (got {})", in.margin);
  if (in.min_refresh_steps < 1) usage_error("--min-refresh-steps", "must be >= 1 (got {})", in.min_refresh_steps);
  if (in.bcast_alpha < 0 || in.bcast_beta < 0)
    usage_error(in.bcast_alpha < 0 ? "--bcast-alpha" : "--bcast-beta", "must be >= 0 (got {})",
                in.bcast_alpha < 0 ? in.bcast_alpha : in.bcast_beta);
  if (in.kfac.empty() || (in.kfac.size() != 1 && static_cast<int>(in.kfac.size()) != sch.stages))
    usage_error("--kfac", "K-FAC costs for {} stages but the schedule has {}", in.kfac.size(), sch.stages);
  for (const StageKfacCost& c : in.kfac)
    if (in.work == BubbleWork::soap) {
      if (c.layers() < 1 || c.eig_r.size() != c.eig_l.size() || c.statistics.size() != c.eig_l.size())
        usage_error("--kfac", "every stage needs SOAP's two refreshes and its statistics for each of its rotated weights");
    } else if (c.layers() < 1 || c.curv_b.size() != c.curv_a.size() || c.inv_a.size() != c.curv_a.size() ||
        c.inv_b.size() != c.curv_a.size() || c.dim_a.size() != c.curv_a.size() || c.dim_b.size() != c.curv_a.size() ||
        (!c.diag_b.empty() && c.diag_b.size() != c.curv_a.size()))
      usage_error("--kfac", "every stage needs curvature, inversion and sizes for each of its layers");
  if (!in.durations.empty()) {
    bool ok = static_cast<int>(in.durations.size()) == sch.devices;
    for (int d = 0; ok && d < sch.devices; ++d) ok = in.durations[d].size() == sch.per_device[d].size();
    if (!ok) usage_error("--profile", "measured durations do not have the shape of the schedule");
  }
  for (const auto& row : sch.per_device)
    for (const Action& a : row)
      if (is_kfac(a.kind) || is_soap(a.kind))
        usage_error("--schedule-file", "the schedule already has K-FAC action {}; the planner adds them", to_token(a));
}

}  // namespace

plan::PlanState::PlanState(const PlanInput& input) {
  OptimizerSetAside set_aside = set_aside_optimizer(input);
  in = std::move(set_aside.in);
  optimizer = std::move(set_aside.optimizer);
}

bool plan::PlanState::any_inline() const {
  for (const CycleStep0& step0 : cycle_step0)
    for (const auto& at : step0.inline_at)
      if (!at.empty()) return true;
  return false;
}

// The one dispatch table of the passes: each output is stored here and nowhere else.
void plan::run_pass(PlanState& state, Pass pass) {
  switch (pass) {
    case Pass::place_weight_gradients: state.step = place_weight_gradients(state); return;
    case Pass::split_precondition: state.prec_splits = split_precondition(state); return;
    case Pass::place_precondition: state.base = place_precondition(state); return;
    case Pass::make_units: state.device_units = make_units(state); return;
    case Pass::build_cycle_step0: state.cycle_step0 = build_cycle_step0(state); return;
    case Pass::pin_collectives: state.pins = pin_collectives(state); return;
    case Pass::pack_by_strategy: state.packed = pack_by_strategy(state); return;
    case Pass::set_cycle_lengths: state.cycles = set_cycle_lengths(state); return;
    case Pass::emit_lists: state.emitted = emit_lists(state); return;
    case Pass::measure: state.measures = measure(state); return;
  }
}

// The plan's fields, each from the pass that computed it.
KfacPlan plan::assemble(PlanState&& state) {
  KfacPlan plan;
  plan.devices = state.devices();
  plan.replicas = state.replicas();
  plan.step_template = state.in.schedule;
  plan.weight_gradients = state.step.moves;
  plan.prec_splits = std::move(state.prec_splits);
  plan.plain_step_time = state.base.plain_step_time;
  plan.base_step_time = state.base.timeline.step_time;
  plan.base = std::move(state.base.timeline);
  for (PackedDevice& packed : state.packed) plan.strategy.push_back(std::move(packed.strategy));
  Cycles& cycles = state.cycles;
  plan.refresh_steps = std::move(cycles.refresh_steps);
  plan.common_cycle = cycles.common_cycle;
  plan.sync_steps = std::move(cycles.sync_steps);
  plan.sync_step = cycles.sync_step;
  plan.step0 = std::move(cycles.step0);
  plan.step0_time = cycles.step0_time;
  EmittedLists& emitted = state.emitted;
  plan.kfac_work = std::move(emitted.kfac_work);
  plan.device_inline = std::move(emitted.device_inline);
  plan.utilization_per_device = std::move(emitted.utilization_per_device);
  plan.lists_ = std::move(emitted.lists);
  Measures& m = state.measures;
  plan.bubble = std::move(m.bubble);
  plan.precondition = std::move(m.precondition);
  plan.lower_bound_refresh_steps = std::move(m.lower_bound_refresh_steps);
  plan.utilization = m.utilization;
  plan.inline_time = m.inline_time;
  plan.step_time = m.step_time;
  return plan;
}

int StagePlacement::owner_of(const Action& a) const {
  const Kind inv = a.kind == Kind::BCAST_INV_A ? Kind::INV_A : a.kind == Kind::BCAST_INV_B ? Kind::INV_B : a.kind;
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k] == Action{inv, a.stage, a.pipeline, -1, a.layer, a.block}) return placement.owner[k];
  PF_CHECK(false, "{} is no inversion piece of stage {} pipeline {}", to_token(a), stage, pipeline);
  return kEveryRank;
}

namespace {

// The passes up to the base step (the step with PREC).
plan::PlanState base_step(const PlanInput& in) {
  plan::PlanState state(in);
  for (size_t i = 0; i < plan::kBasePasses; ++i) plan::run_pass(state, plan::kPasses[i]);
  return state;
}

// The other passes.
KfacPlan finish(plan::PlanState& state) {
  for (size_t i = plan::kBasePasses; i < std::size(plan::kPasses); ++i) plan::run_pass(state, plan::kPasses[i]);
  return plan::assemble(std::move(state));
}

// PrecPlacement::best's order: the longest refresh, the refresh steps' sum, the step.
bool better(const KfacPlan& a, const KfacPlan& b) {
  auto key = [](const KfacPlan& p) {
    return std::tuple(*std::max_element(p.refresh_steps.begin(), p.refresh_steps.end()),
                      std::accumulate(p.refresh_steps.begin(), p.refresh_steps.end(), 0), p.step_time);
  };
  return key(a) < key(b);
}

}  // namespace

PlanInput plan_input(const Schedule& step, const PlanSettings& settings, std::pair<double, double> bcast,
                     const std::vector<StageKfacCost>& measured, double scale) {
  PlanInput in;
  static_cast<PlanSettings&>(in) = settings;
  in.schedule = step;
  std::tie(in.bcast_alpha, in.bcast_beta) = bcast;
  for (const StageKfacCost& c : measured) in.kfac.push_back(planner_cost(c, scale));
  return in;
}

KfacPlan plan_kfac(const PlanInput& in) {
  check_input(in);
  if (in.precondition != PrecPlacement::best) {
    plan::PlanState state = base_step(in);
    return finish(state);
  }
  PlanInput gaps = in, end = in;
  gaps.precondition = PrecPlacement::gaps;
  end.precondition = PrecPlacement::end;
  plan::PlanState a = base_step(gaps), b = base_step(end);
  KfacPlan pa = finish(a);
  if (a.base.timed.schedule.per_device == b.base.timed.schedule.per_device) return pa;  // every PREC at its device's end anyway
  KfacPlan pb = finish(b);
  return better(pb, pa) ? std::move(pb) : std::move(pa);
}

}  // namespace pf
