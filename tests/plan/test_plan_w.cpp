// The zero-bubble pass (place_weight_gradients, plan/plan_w.cpp): W moved into earlier gaps of
// its device before any K-FAC unit, on a step timed by hand.
#include "planner_fixtures.hpp"

#include "sim/memory.hpp"
#include "sim/sim.hpp"

namespace pf {
namespace {

using planner_test::check_plan;
using planner_test::tiny;

// ZB-H1, D = 2, N = 3 (both devices' lists as the generator orders them):
//   device 0: F0 F1 I0 W0 F2 I1 W1 I2 W2     (F 3, I 0.5, W 0.5 ms: a slow first stage)
//   device 1: F0 I0 F1 I1 W0 F2 I2 W1 W2     (F 0.5, I 0.5, W 1.5 ms: a heavy weight gradient)
// By hand, no margin: device 0 runs F0 [0,3] F1 [3,6] I0 [6,6.5] W0 [6.5,7] F2 [7,10] I1 [10,10.5]
// W1 [10.5,11] I2 [11,11.5] W2 [11.5,12]; device 1 F0 [3,3.5] I0 [3.5,4], waits for F1 until 6,
// F1 [6,6.5] I1 [6.5,7] W0 [7,8.5], waits for F2 until 10, F2 [10,10.5] I2 [10.5,11] W1 [11,12.5]
// W2 [12.5,14]: step 14. Device 1's W0 (ready at 4) fits its gap [4,6] before F1; then W1 (ready
// at 7, after I1 and W0) fits [7,10] before F2; W2 follows the last I: device 1 ends at
// 11 + 1.5 = 12.5, one W (1.5) earlier. Device 0's W each follow their I at once: they stay.
PlanInput slow_first_stage(double margin) {
  PlanInput in = tiny();
  in.schedule = make_zb_h1(2, 3);
  in.margin = margin;
  const std::map<Kind, double> ms[2] = {{{Kind::F, 3}, {Kind::I, 0.5}, {Kind::W, 0.5}},
                                        {{Kind::F, 0.5}, {Kind::I, 0.5}, {Kind::W, 1.5}}};
  in.durations.assign(2, {});
  for (int d = 0; d < 2; ++d)
    for (const Action& a : in.schedule.per_device[d]) in.durations[d].push_back(ms[d].at(a.kind));
  return in;
}

// The step's own actions (no K-FAC unit) of a list.
std::vector<std::string> own_actions(const std::vector<Action>& list) {
  std::vector<std::string> out;
  for (const Action& a : list)
    if (!is_kfac(a.kind)) out.push_back(to_token(a));
  return out;
}

TEST(PlanW, MovesWIntoEarlierGapsAndShortensTheStep) {
  const PlanInput in = slow_first_stage(0);
  // The hand-timed step before the pass, from the simulator alone.
  EXPECT_DOUBLE_EQ(simulate(in.schedule, in.cost, &in.durations).step_time, 14);
  const KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.weight_gradients.total, 6);
  EXPECT_EQ(p.weight_gradients.moved, 2);
  EXPECT_DOUBLE_EQ(p.weight_gradients.step_before, 14);
  EXPECT_DOUBLE_EQ(p.weight_gradients.step_after, 12.5);
  EXPECT_DOUBLE_EQ(p.plain_step_time, 12.5);
  EXPECT_EQ(p.weight_gradients.line(),
            "zero-bubble W: 2 of 6 moved into earlier gaps, step 14.000 -> 12.500 without K-FAC work");
  // Every list the runtime runs carries the moved W; device 0's order is the generator's.
  for (int t = 0; t < 2 * p.period(); ++t) {
    EXPECT_EQ(own_actions(p.actions(0, 0, t)),
              (std::vector<std::string>{"0F0", "0F1", "0I0", "0W0", "0F2", "0I1", "0W1", "0I2", "0W2"}));
    EXPECT_EQ(own_actions(p.actions(0, 1, t)),
              (std::vector<std::string>{"1F0", "1I0", "1W0", "1F1", "1I1", "1W1", "1F2", "1I2", "1W2"}));
  }
  EXPECT_EQ(own_actions(p.plain_actions(0, 1)),
            (std::vector<std::string>{"1F0", "1I0", "1W0", "1F1", "1I1", "1W1", "1F2", "1I2", "1W2"}));
  // The moved W run where the gaps were: W0 [4,5.5], W1 [7,8.5].
  for (const TimedAction& t : p.base.per_device[1]) {
    if (t.action == act(Kind::W, 1, 0)) EXPECT_DOUBLE_EQ(t.start, 4);
    if (t.action == act(Kind::W, 1, 1)) EXPECT_DOUBLE_EQ(t.start, 7);
  }
  // The memory model over the planned step (what the runtime holds, in list order): device 1
  // held F0, F1's activations and I0, I1's deferred gradients at 7 (4 units of 1); with W0 done
  // at 5.5 and W1 at 8.5 it holds one micro-batch's of each at most (2).
  std::vector<StageMemory> mem(2);
  mem[1].act = 1;
  mem[1].deferred = 1;
  EXPECT_DOUBLE_EQ(memory_model(in.schedule, simulate(in.schedule, in.cost, &in.durations), mem).activations_in_flight, 4);
  const MemoryReport moved = memory_model(in.schedule, p.base, mem);
  EXPECT_EQ(moved.device, 1);
  EXPECT_DOUBLE_EQ(moved.activations_in_flight, 2);
  EXPECT_DOUBLE_EQ(moved.activations, 6);  // N * (M_act + M_W) either way
}

// With margin 0.5 W0 needs 2.25 of its 2 ms gap and W1 (behind W0, ready at 8.5) 2.25 of the
// 1.5 left before F2: nothing moves.
TEST(PlanW, AWThatFitsNoEarlierGapWithMarginKeepsItsPlace) {
  const PlanInput in = slow_first_stage(0.5);
  const KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.weight_gradients.moved, 0);
  EXPECT_DOUBLE_EQ(p.weight_gradients.step_before, 14);
  EXPECT_DOUBLE_EQ(p.weight_gradients.step_after, 14);
  EXPECT_EQ(own_actions(p.actions(0, 1, 0)),
            (std::vector<std::string>{"1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1I2", "1W1", "1W2"}));
}

// A schedule without W (a fused backward) has nothing to move: the pass only times its step.
TEST(PlanW, ScheduleWithoutWIsLeftAsItIs) {
  PlanInput in = tiny();
  in.schedule = make_1f1b(2, 3);
  const KfacPlan p = plan_kfac(in);
  EXPECT_EQ(p.weight_gradients.total, 0);
  EXPECT_EQ(p.weight_gradients.moved, 0);
  EXPECT_DOUBLE_EQ(p.weight_gradients.step_after, p.weight_gradients.step_before);
  EXPECT_DOUBLE_EQ(p.plain_step_time, simulate(in.schedule, in.cost).step_time);
}

}  // namespace
}  // namespace pf
