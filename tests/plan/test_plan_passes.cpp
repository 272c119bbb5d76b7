// Each pass of the planner (plan/plan_state.hpp) on a tiny input whose outputs are worked out by
// hand: GPipe on 2 devices (stage s on device s), 2 micro-batches, F 1 ms, B 2 ms, no
// point-to-point time; one K-FAC layer per stage (curvature 0.25 ms per micro-batch and factor,
// inversion 0.5 ms per factor, precondition 1 ms), no margin.
//
//   step without K-FAC:  device 0  F0 [0,1] F1 [1,2]  .......  B0 [5,7] B1 [7,9]
//                        device 1  ..  F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]  .....
//   PREC: device 0 at its end [9,10]; device 1 in its tail gap [7,8]. Base step 10 ms; gaps:
//   device 0 [2,5]; device 1 [0,1] (leading) and [8,10].
#include "plan/plan_state.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace pf::plan {
namespace {

PlanInput tiny_input() {
  PlanInput in;
  Schedule& s = in.schedule;
  s.name = "tiny";
  s.devices = 2, s.stages = 2, s.micro_batches = 2;
  s.stage_device = {{0, 1}};
  s.per_device = {{act(Kind::F, 0, 0), act(Kind::F, 0, 1), act(Kind::B, 0, 0), act(Kind::B, 0, 1), act(Kind::OPT, 0, -1)},
                  {act(Kind::F, 1, 0), act(Kind::F, 1, 1), act(Kind::B, 1, 0), act(Kind::B, 1, 1), act(Kind::OPT, 1, -1)}};
  in.durations = {{1, 1, 2, 2, 0.5}, {1, 1, 2, 2, 0.5}};
  StageKfacCost c;
  c.curv_a = {0.25}, c.curv_b = {0.25}, c.inv_a = {0.5}, c.inv_b = {0.5}, c.dim_a = {4}, c.dim_b = {4};
  c.precondition = 1;
  in.kfac = {c};
  in.margin = 0;
  in.precondition = PrecPlacement::gaps;
  return in;
}

std::vector<std::string> tokens(const std::vector<Action>& list) {
  std::vector<std::string> out;
  for (const Action& a : list) out.push_back(to_token(a));
  return out;
}

std::vector<std::string> tokens(const std::vector<Unit>& units) {
  std::vector<std::string> out;
  for (const Unit& u : units) out.push_back(to_token(u.action));
  return out;
}

// The passes before `last` (in planner.cpp's order; every pass without one) on the tiny input.
PlanState run_until(std::optional<Pass> last, const PlanInput& in = tiny_input()) {
  PlanState state(in);
  for (Pass pass : kPasses) {
    if (pass == last) break;
    run_pass(state, pass);
  }
  return state;
}

TEST(PlanPasses, SetAsideOptimizerTakesTheOptsOutOfTheStepAndTheirDurations) {
  PlanState state = run_until(Pass::split_precondition);
  EXPECT_EQ(tokens(state.optimizer[0]), tokens(std::vector<Action>{act(Kind::OPT, 0, -1)}));
  EXPECT_EQ(tokens(state.optimizer[1]), tokens(std::vector<Action>{act(Kind::OPT, 1, -1)}));
  EXPECT_EQ(state.in.schedule.per_device[0].size(), 4u);
  EXPECT_EQ(state.in.durations[1], (std::vector<double>{1, 1, 2, 2}));
}

// GPipe has no W: the step as set aside, timed (ZB-H1's moves: test_plan_w.cpp).
TEST(PlanPasses, PlaceWeightGradientsTimesTheStepAndMovesNothingWithoutW) {
  PlanState state = run_until(Pass::split_precondition);
  EXPECT_EQ(tokens(state.step.timed.schedule.per_device[0]), tokens(state.in.schedule.per_device[0]));
  EXPECT_EQ(state.step.timed.durations, state.in.durations);
  EXPECT_EQ(state.step.moves.total, 0);
  EXPECT_DOUBLE_EQ(state.step.moves.step_before, 9);
  EXPECT_DOUBLE_EQ(state.step.moves.step_after, 9);
}

TEST(PlanPasses, SplitPreconditionSplitsNothingForOneHolderAndNothingThatWouldNotShorten) {
  EXPECT_TRUE(run_until(Pass::place_precondition).prec_splits.empty());
  // Two replicas, one layer: the owner's share with its gather is the whole precondition.
  PlanInput in = tiny_input();
  in.replicas = 2;
  PlanState state = run_until(Pass::place_precondition, in);
  ASSERT_EQ(state.prec_splits.size(), 2u);
  for (const PrecSplit& ps : state.prec_splits) {
    EXPECT_FALSE(ps.split());
    EXPECT_EQ(ps.time, (std::vector<double>{1, 1}));
  }
}

TEST(PlanPasses, PlacePreconditionPutsPrecInTheFirstGapAfterTheGradientsElseAtTheEnd) {
  PlanState state = run_until(Pass::make_units);
  EXPECT_EQ(state.base.plain_step_time, 9);
  EXPECT_EQ(state.base.timeline.step_time, 10);
  const auto& d0 = state.base.timeline.per_device[0];
  const auto& d1 = state.base.timeline.per_device[1];
  ASSERT_EQ(d0.size(), 5u);
  ASSERT_EQ(d1.size(), 5u);
  EXPECT_EQ(to_token(d0[4].action), to_token(Action{Kind::PREC, 0, 0, -1, -1}));
  EXPECT_EQ(d0[4].start, 9);
  EXPECT_EQ(to_token(d1[4].action), to_token(Action{Kind::PREC, 1, 0, -1, -1}));
  EXPECT_EQ(d1[4].start, 7);
  EXPECT_EQ(state.base.largest_shared_gap, (std::vector<double>{3, 2}));
}

TEST(PlanPasses, MakeUnitsMakesCurvatureAfterItsPassAndInversionsAfterTheirCurvature) {
  PlanState state = run_until(Pass::build_cycle_step0);
  const std::vector<Unit>& units = state.device_units[0].units;
  EXPECT_EQ(tokens(units), tokens(std::vector<Action>{{Kind::CURV_A, 0, 0, 0, 0}, {Kind::CURV_A, 0, 0, 1, 0},
                                                      {Kind::CURV_B, 0, 0, 0, 0}, {Kind::CURV_B, 0, 0, 1, 0},
                                                      {Kind::INV_A, 0, 0, -1, 0}, {Kind::INV_B, 0, 0, -1, 0}}));
  std::vector<double> ready;
  for (const Unit& u : units) ready.push_back(u.ready);
  EXPECT_EQ(ready, (std::vector<double>{1, 2, 7, 9, 0, 0}));
  EXPECT_EQ(units[4].deps, (std::vector<int>{0, 1}));
  EXPECT_EQ(units[5].deps, (std::vector<int>{2, 3}));
  for (const Unit& u : units) EXPECT_FALSE(u.runs_inline || u.pinned);
  EXPECT_TRUE(state.device_units[0].splits.empty());
}

TEST(PlanPasses, BuildCycleStep0PutsInlineWorkBeforeItsStagesPrecWithItsOwnKind) {
  PlanState state = run_until(Pass::build_cycle_step0);
  // A hand-made inline sync of 0.5 ms on device 0, run by its replica alone.
  Unit sync;
  sync.action = Action{Kind::SYNC_CURV, 0, 0, -1, -1};
  sync.duration = 0.5;
  sync.runs_inline = true;
  state.device_units[0].units.push_back(sync);
  run_pass(state, Pass::build_cycle_step0);
  ASSERT_EQ(state.cycle_step0.size(), 1u);
  const CycleStep0& step0 = state.cycle_step0[0];
  EXPECT_TRUE(state.any_inline());
  EXPECT_EQ(step0.inline_at[0], (std::vector<std::pair<int, int>>{{6, 4}}));
  EXPECT_TRUE(step0.inline_at[1].empty());
  const TimedAction& timed = step0.timeline.per_device[0][4];
  EXPECT_EQ(timed.action, sync.action);
  EXPECT_EQ(step0.step.schedule.per_device[0][4], sync.action);
  EXPECT_EQ(timed.start, 9);  // after the stage's gradients, as its PREC
  EXPECT_EQ(timed.end, 9.5);
  EXPECT_EQ(step0.timeline.per_device[0][5].start, 9.5);
  EXPECT_EQ(step0.timeline.step_time, 10.5);
}

TEST(PlanPasses, PinCollectivesPinsNothingWithOnePipeline) {
  PlanState state = run_until(Pass::pack_by_strategy);
  ASSERT_EQ(state.pins.size(), 2u);
  for (const CollectivePin& pin : state.pins) {
    EXPECT_EQ(pin.sync_step, -1);
    EXPECT_EQ(pin.period, 0);
  }
}

TEST(PlanPasses, PackByStrategyFillsTheGapsOfConsecutiveStepsFirstFitInReadyOrder) {
  PlanState state = run_until(Pass::set_cycle_lengths);
  ASSERT_EQ(state.packed.size(), 2u);
  // Device 0: curvature A and INV_A in step 0's gap [2,5]; curvature B (ready at 7 and 9) and
  // INV_B in step 1's gap [12,15].
  const DevicePlacement& d0 = state.packed[0].replicas[0];
  EXPECT_EQ(d0.start, (std::vector<double>{2, 2.25, 12, 12.25, 2.5, 12.5}));
  EXPECT_EQ(d0.needed, 2);
  // Device 1: everything in step 0's tail gap [8,10].
  const DevicePlacement& d1 = state.packed[1].replicas[0];
  EXPECT_EQ(d1.start, (std::vector<double>{8, 8.25, 8.5, 8.75, 9, 9.5}));
  EXPECT_EQ(d1.needed, 1);
  EXPECT_EQ(state.packed[0].strategy, "curvature ready-order first-fit, inversion ready-order first-fit");
  EXPECT_FALSE(state.packed[0].split_to_shorten);
}

TEST(PlanPasses, SetCycleLengthsTakesEachDevicesStepsNeeded) {
  PlanState state = run_until(Pass::emit_lists);
  EXPECT_EQ(state.cycles.refresh_steps, (std::vector<int>{2, 1}));
  EXPECT_FALSE(state.cycles.common_cycle);
  EXPECT_EQ(state.cycles.sync_steps, (std::vector<int>{-1, -1}));
  EXPECT_EQ(state.cycles.sync_step, -1);
  EXPECT_EQ(state.cycles.step0_time, 10);
}

TEST(PlanPasses, EmitListsPutsEachUnitAtItsGapsPlaceAndTheOptimizerLast) {
  const KfacPlan plan = assemble(run_until(std::nullopt));
  const Action prec0{Kind::PREC, 0, 0, -1, -1}, prec1{Kind::PREC, 1, 0, -1, -1};
  EXPECT_EQ(tokens(plan.cycle_actions(0, 0, 0)),
            tokens(std::vector<Action>{act(Kind::F, 0, 0), act(Kind::F, 0, 1), {Kind::CURV_A, 0, 0, 0, 0},
                                       {Kind::CURV_A, 0, 0, 1, 0}, {Kind::INV_A, 0, 0, -1, 0}, act(Kind::B, 0, 0),
                                       act(Kind::B, 0, 1), prec0, act(Kind::OPT, 0, -1)}));
  EXPECT_EQ(tokens(plan.cycle_actions(0, 0, 1)),
            tokens(std::vector<Action>{act(Kind::F, 0, 0), act(Kind::F, 0, 1), {Kind::CURV_B, 0, 0, 0, 0},
                                       {Kind::CURV_B, 0, 0, 1, 0}, {Kind::INV_B, 0, 0, -1, 0}, act(Kind::B, 0, 0),
                                       act(Kind::B, 0, 1), prec0, act(Kind::OPT, 0, -1)}));
  EXPECT_EQ(tokens(plan.cycle_actions(0, 1, 0)),
            tokens(std::vector<Action>{act(Kind::F, 1, 0), act(Kind::F, 1, 1), act(Kind::B, 1, 0), act(Kind::B, 1, 1),
                                       prec1, {Kind::CURV_A, 1, 0, 0, 0}, {Kind::CURV_A, 1, 0, 1, 0},
                                       {Kind::CURV_B, 1, 0, 0, 0}, {Kind::CURV_B, 1, 0, 1, 0},
                                       {Kind::INV_A, 1, 0, -1, 0}, {Kind::INV_B, 1, 0, -1, 0}, act(Kind::OPT, 1, -1)}));
  ASSERT_EQ(plan.refresh_steps[0], 2);
  for (int k = 0; k < 2; ++k) {  // nothing wrapped: the first cycle runs the steady-state lists
    EXPECT_EQ(plan.actions(0, 0, k), plan.cycle_actions(0, 0, k));
    EXPECT_TRUE(plan.wrapped(0, 0, k).empty());
  }
  EXPECT_EQ(plan.units().size(), 12u);
  EXPECT_EQ(plan.kfac_work, (std::vector<double>{2, 2}));
  EXPECT_EQ(plan.device_inline, (std::vector<double>{0, 0}));
  EXPECT_TRUE(plan.splits().empty());
  EXPECT_TRUE(plan.placements().empty());
  // Busy: F, B and PREC 7 ms a step, plus 2 ms of K-FAC per cycle of 2 steps (device 0) or 1.
  EXPECT_DOUBLE_EQ(plan.utilization_per_device[0], 16.0 / 20);
  EXPECT_DOUBLE_EQ(plan.utilization_per_device[1], 9.0 / 10);
}

TEST(PlanPasses, MeasureTakesBubblesBoundsAndTheStep) {
  const KfacPlan plan = assemble(run_until(std::nullopt));
  EXPECT_EQ(plan.bubble, (std::vector<double>{3, 3}));
  EXPECT_EQ(plan.precondition, (std::vector<double>{1, 1}));
  EXPECT_EQ(plan.lower_bound_refresh_steps, (std::vector<int>{1, 1}));
  EXPECT_EQ(plan.inline_time, 0);
  EXPECT_EQ(plan.step_time, 10);
  EXPECT_DOUBLE_EQ(plan.utilization, (16.0 / 20 + 9.0 / 10) / 2);
}

}  // namespace
}  // namespace pf::plan
