// What the runtime asks a KfacPlan besides its lists (plan/planner_queries.cpp), on the hand-
// computed GPipe plan of test_planner.cpp (tiny(): refresh_steps {2, 2}; with split_to_shorten
// {2, 1} and stage 1's two factors in 2 blocks each).
#include "plan/planner.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "planner_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace pf {
namespace {

using namespace planner_test;

TEST(PlanQueries, CycleStartsFollowEachDevicesRefreshSteps) {
  PlanInput in = tiny();
  in.split_to_shorten = true;
  const KfacPlan p = plan_kfac(in);
  ASSERT_EQ(p.refresh_steps, (std::vector<int>{2, 1}));
  EXPECT_TRUE(p.is_cycle_start(0, 0));
  EXPECT_FALSE(p.is_cycle_start(0, 1));
  EXPECT_TRUE(p.is_cycle_start(0, 2));
  EXPECT_TRUE(p.is_cycle_start(1, 1));
  EXPECT_EQ(p.next_cycle_start(0, 0), 0);
  EXPECT_EQ(p.next_cycle_start(0, 1), 2);
  EXPECT_EQ(p.next_cycle_start(0, 3), 4);
  EXPECT_EQ(p.next_cycle_start(1, 3), 3);
  // Device 0 reaches a cycle start at 2 and 4, device 1 at every step.
  EXPECT_EQ(p.all_cycles_start(1), 2);
  EXPECT_EQ(p.all_cycles_start(2), 2);
  EXPECT_EQ(p.all_cycles_start(3), 4);
}

TEST(PlanQueries, SplitBlocksNameThePlannedSplits) {
  PlanInput in = tiny();
  in.split_to_shorten = true;
  const KfacPlan p = plan_kfac(in);
  EXPECT_EQ(p.split_blocks(0, 1, 0, Kind::INV_A), 2);
  EXPECT_EQ(p.split_blocks(0, 1, 0, Kind::INV_B), 2);
  EXPECT_EQ(p.split_blocks(0, 0, 0, Kind::INV_A), 1);
  EXPECT_EQ(p.split_blocks(0, 0, 0, Kind::INV_B), 1);
  EXPECT_EQ(plan_kfac(tiny()).split_blocks(0, 1, 0, Kind::INV_A), 1);  // nothing split by default
}

TEST(PlanQueries, PlainActionsKeepOnlyTheStepAndItsPrecondition) {
  const KfacPlan p = plan_kfac(tiny());
  EXPECT_EQ(p.plain_actions(0, 0), (std::vector<Action>{act(Kind::F, 0, 0), act(Kind::F, 0, 1), act(Kind::B, 0, 0),
                                                        act(Kind::B, 0, 1), act(Kind::PREC, 0, -1)}));
  EXPECT_EQ(p.plain_actions(0, 1), (std::vector<Action>{act(Kind::F, 1, 0), act(Kind::F, 1, 1), act(Kind::B, 1, 0),
                                                        act(Kind::B, 1, 1), act(Kind::PREC, 1, -1)}));
  // The steady-state lists: device 1's cycle step 1 starts with the wrapped-free INV_A (test_planner.cpp).
  EXPECT_EQ(p.cycle_actions(0, 1, 1), p.actions(0, 1, 1));
  EXPECT_EQ(p.cycle_actions(0, 1, 0), p.actions(0, 1, 2));
}

// The lists have one writer (plan::assemble): outside the plan no code can name them, only
// ask the queries (units(), actions(), cycle_actions(), wrapped(), splits(), placements()).
template <class P> concept ListsReachable = requires(P p) { p.lists_; };
template <class P> concept CycleReachable = requires(P p) { p.cycle; };
template <class P> concept FirstCycleReachable = requires(P p) { p.first_cycle; };
template <class P> concept WrappedUnitsReachable = requires(P p) { p.wrapped_units; };
template <class P> concept UnitsWritable = requires(P p) { p.units().clear(); };
template <class P> concept SplitsWritable = requires(P p) { p.splits().clear(); };
template <class P> concept PlacementsWritable = requires(P p) { p.placements().clear(); };

TEST(PlanQueries, ListsAreReadOnlyThroughTheQueries) {
  static_assert(!ListsReachable<KfacPlan> && !CycleReachable<KfacPlan> && !FirstCycleReachable<KfacPlan> &&
                !WrappedUnitsReachable<KfacPlan> && !UnitsWritable<KfacPlan> && !SplitsWritable<KfacPlan> &&
                !PlacementsWritable<KfacPlan>);
  const KfacPlan p = plan_kfac(tiny());
  EXPECT_EQ(p.units().size(), 12u);  // both devices' curvature and inversion units, once per cycle
  EXPECT_TRUE(p.wrapped(0, 0, 0).empty());
}

TEST(PlanQueries, ProfilingActionsPutEachHostedStagesPrecBeforeTheFirstOpt) {
  // Without OPTs: the PREC ends the list.
  const InlineStep g = profiling_actions(tiny().schedule, 0);
  EXPECT_EQ(g.actions, (std::vector<Action>{act(Kind::F, 0, 0), act(Kind::F, 0, 1), act(Kind::B, 0, 0),
                                            act(Kind::B, 0, 1), act(Kind::PREC, 0, -1)}));
  EXPECT_EQ(g.step_index, (std::vector<int>{0, 1, 2, 3, -1}));
  // Chimera, lowered with OPTs: device 0 hosts stage 0 (down) and stage 3 (up); their PRECs in
  // stage order right before the first OPT, every other action where the step has it.
  const Schedule s = lower_communication(make_schedule("chimera", 4, 4), {.grad_sync = false, .optimizer = true});
  ASSERT_EQ(s.device_of(1, 3), 0);
  const std::vector<Action>& step = s.per_device[0];
  const InlineStep c = profiling_actions(s, 0);
  const auto opt = std::find_if(step.begin(), step.end(), [](const Action& a) { return a.kind == Kind::OPT; });
  ASSERT_NE(opt, step.end());
  const size_t at = static_cast<size_t>(opt - step.begin());
  ASSERT_EQ(c.actions.size(), step.size() + 2);
  EXPECT_EQ(c.actions[at], (Action{Kind::PREC, 0, 0, -1, -1}));
  EXPECT_EQ(c.actions[at + 1], (Action{Kind::PREC, 3, 1, -1, -1}));
  for (size_t i = 0; i < c.actions.size(); ++i) {
    if (i == at || i == at + 1) {
      EXPECT_EQ(c.step_index[i], -1);
      continue;
    }
    ASSERT_EQ(c.step_index[i], static_cast<int>(i < at ? i : i - 2));
    EXPECT_EQ(c.actions[i], step[static_cast<size_t>(c.step_index[i])]);
  }
}

}  // namespace
}  // namespace pf
