// The PipeFisher planner: placement rules, utilization on the paper's BERT-Large profile, splits,
// inline fallback, every schedule, data + inversion parallelism, a hand-computed case.
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "schedule/validate.hpp"
#include "plan/planner.hpp"
#include "sim/profile.hpp"
#include "planner_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <set>

namespace pf {
namespace {

using namespace planner_test;

TEST(Planner, BertLargeOneFOneBFillsBubblesNearTheLowerBound) {
  // BERT-Large (24 blocks) on D = 8 stages: 3 blocks per stage; the paper's profile is per
  // block and scales with blocks per stage (its Figure 5 text; profile_from_row does the same).
  // Exact factors (the default): nothing split. Each later stage's precondition runs in its
  // tail gap (after its last backward, before device 0's ends the step), so it takes none of the
  // gaps the units need: every device refreshes in 2 steps, the lower bound, over 90% busy.
  PlanInput in = bert_large("1f1b", 8, 8, 3);
  KfacPlan plan = plan_kfac(in);
  check_plan(in, plan);
  EXPECT_EQ(plan.inline_time, 0);
  EXPECT_TRUE(plan.splits().empty());
  EXPECT_GT(plan.utilization, 0.90);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(plan.refresh_steps[d], 2) << d;
  // split_to_shorten: nothing to gain, so nothing is split.
  PlanInput split = in;
  split.split_to_shorten = true;
  KfacPlan shorter = plan_kfac(split);
  check_plan(split, shorter);
  EXPECT_TRUE(shorter.splits().empty());
  EXPECT_EQ(shorter.refresh_steps, plan.refresh_steps);
  // With finer units (6 blocks per stage) every device refreshes in 2 steps: over 90%.
  KfacPlan fine = plan_kfac(bert_large("1f1b", 8, 8, 6));
  EXPECT_GT(fine.utilization, 0.90);
  EXPECT_EQ(fine.inline_time, 0);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(plan.lower_bound_refresh_steps[d], 2) << d;  // ceil(300.45 / 186.69)
    EXPECT_LE(plan.refresh_steps[d], plan.lower_bound_refresh_steps[d] + 1) << d;
  }
  // Precondition is the only overhead: T_pipe + T_prec.
  EXPECT_NEAR(plan.step_time, 15 * 3 * (kTf + kTb) + 3 * kTprec, 1e-9);
}

TEST(Planner, HandComputedGPipe) {
  PlanInput in = tiny();
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.base_step_time, 9.5);
  EXPECT_EQ(p.step_time, 9.5);
  EXPECT_EQ(p.inline_time, 0);
  EXPECT_EQ(p.bubble, (std::vector<double>{3, 3}));
  EXPECT_EQ(p.kfac_work, (std::vector<double>{4, 4}));
  EXPECT_EQ(p.lower_bound_refresh_steps, (std::vector<int>{2, 2}));  // ceil(4 / 3)
  EXPECT_EQ(p.refresh_steps, (std::vector<int>{2, 2}));
  // Device 0: curvature A in the gap after the forwards, inversion A right after; curvature B
  // only after B1 (step 1's gap, at 9.5 + 2), then inversion B.
  auto at = [&](int d, const char* t) {
    const PlacedUnit& u = unit(p, d, t);
    return std::tuple{u.step, u.start, u.end};
  };
  EXPECT_EQ(at(0, "0CURV_A0l0"), std::tuple(0, 2.0, 2.5));
  EXPECT_EQ(at(0, "0CURV_A1l0"), std::tuple(0, 2.5, 3.0));
  EXPECT_EQ(at(0, "0INV_Al0"), std::tuple(0, 3.0, 4.0));
  EXPECT_EQ(at(0, "0CURV_B0l0"), std::tuple(1, 2.0, 2.5));
  EXPECT_EQ(at(0, "0CURV_B1l0"), std::tuple(1, 2.5, 3.0));
  EXPECT_EQ(at(0, "0INV_Bl0"), std::tuple(1, 3.0, 4.0));
  // Device 1: all curvature in its tail gap; inversion A in step 1's leading gap, B in its tail.
  EXPECT_EQ(at(1, "1CURV_A0l0"), std::tuple(0, 7.5, 8.0));
  EXPECT_EQ(at(1, "1CURV_B1l0"), std::tuple(0, 9.0, 9.5));
  EXPECT_EQ(at(1, "1INV_Al0"), std::tuple(1, 0.0, 1.0));
  EXPECT_EQ(at(1, "1INV_Bl0"), std::tuple(1, 7.5, 8.5));
  // Busy over 2 steps: 2 * (6 + 0.5) + 4 of K-FAC, over 19.
  EXPECT_DOUBLE_EQ(p.utilization, 17.0 / 19.0);
  // The action lists the runtime executes.
  EXPECT_EQ(to_text(p.schedule_for(0, 0)).substr(to_text(p.schedule_for(0, 0)).find("\n0:") + 1),
            "0: 0F0 0F1 0CURV_A0l0 0CURV_A1l0 0INV_Al0 0B0 0B1 0PREC\n"
            "1: 1F0 1F1 1B0 1B1 1PREC 1CURV_A0l0 1CURV_A1l0 1CURV_B0l0 1CURV_B1l0\n");
  EXPECT_EQ(p.actions(0, 1, 1), (std::vector<Action>{{Kind::INV_A, 1, 0, -1, 0}, act(Kind::F, 1, 0), act(Kind::F, 1, 1),
                                                     act(Kind::B, 1, 0), act(Kind::B, 1, 1), act(Kind::PREC, 1, -1),
                                                     {Kind::INV_B, 1, 0, -1, 0}}));
  EXPECT_EQ(p.actions(0, 1, 3), p.actions(0, 1, 1));  // cycle of 2 steps
  EXPECT_EQ(p.actions(0, 1, 2), p.actions(0, 1, 0));
}

TEST(Planner, WrappedUnitsRunFromTheSecondCycle) {
  // Device 1's unit in the leading gap of step R belongs to the previous cycle: listed at the
  // start of cycle step 0, omitted in the very first step.
  PlanInput in = tiny(0.5);
  in.kfac[0].inv_b = {0.5};
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  const PlacedUnit& u = unit(p, 1, "1INV_Bl0");
  EXPECT_EQ(p.refresh_steps[1], 1);
  EXPECT_TRUE(u.wrapped);
  EXPECT_EQ(u.start, 0.5);  // after INV_A in the same leading gap
  EXPECT_EQ(p.actions(0, 1, 1).front(), (Action{Kind::INV_A, 1, 0, -1, 0}));
  EXPECT_EQ(p.actions(0, 1, 0).front(), act(Kind::F, 1, 0));
}

// kfac.min_refresh_steps: a device whose units fit in fewer steps still refreshes every this many.
// The case above (device 1: one step, its inversions wrapped into the next step's leading gap)
// with 3-step cycles: the inversions sit at the front of cycle step 1, not wrapped (so in the very
// first cycle too), and cycle step 2 runs no K-FAC unit but the precondition.
TEST(Planner, MinRefreshStepsLengthensShortCycles) {
  PlanInput in = tiny(0.5);
  in.kfac[0].inv_b = {0.5};
  const KfacPlan free = plan_kfac(in);
  in.min_refresh_steps = 3;
  const KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.refresh_steps, (std::vector<int>{std::max(3, free.refresh_steps[0]), 3}));
  const PlacedUnit& u = unit(p, 1, "1INV_Bl0");
  EXPECT_FALSE(u.wrapped);
  EXPECT_EQ(u.step, 1);
  EXPECT_EQ(p.actions(0, 1, 1).front(), (Action{Kind::INV_A, 1, 0, -1, 0}));
  EXPECT_EQ(p.actions(0, 1, 4), p.actions(0, 1, 1));
  for (int t : {2, 5})
    for (const Action& a : p.actions(0, 1, t)) EXPECT_TRUE(!is_kfac(a.kind) || a.kind == Kind::PREC) << to_token(a);
  in.min_refresh_steps = 0;
  EXPECT_THROW(plan_kfac(in), UsageError);
}

TEST(Planner, SplitsWhenThatShortensTheRefreshPeriod) {
  // tiny() with the policy: device 1 (gaps [0,1) leading and [7.5,9.5)) needs 2 steps whole
  // (curvature 2 after the backwards, inversions 1 + 1). Split into 2 blocks of 2 rows, each
  // inversion costs 2 * (2/4)^3 = 0.25: curvature B [7.5,8.5), INV_A blocks [8.5,8.75),
  // [8.75,9), INV_B's [9,9.5): one step. Device 0's curvature B waits for B1 (ends at 9), so
  // splitting cannot shorten its 2 steps: nothing split there.
  PlanInput in = tiny();
  in.split_to_shorten = true;
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.refresh_steps, (std::vector<int>{2, 1}));
  EXPECT_EQ(p.kfac_work, (std::vector<double>{4, 2.5}));
  ASSERT_EQ(p.splits().size(), 2u);
  for (const FactorSplit& f : p.splits()) {
    EXPECT_EQ(f.stage, 1);
    EXPECT_EQ(f.blocks, 2);
    EXPECT_EQ(f.whole, 1);
    EXPECT_EQ(f.pieces, 0.25);
  }
  EXPECT_NE(p.strategy[1].find("split to shorten the refresh period"), std::string::npos);
  EXPECT_EQ(p.inline_time, 0);
}

// A factor cannot be cut into more diagonal blocks than its dimension (BERT's NSP head has a
// 2 x 2 B factor): the policy leaves a 1 x 1 factor whole (it used to fail a check).
TEST(Planner, SplitToShortenNeverCutsAFactorIntoMoreBlocksThanRows) {
  PlanInput in = tiny();
  in.split_to_shorten = true;
  in.kfac.push_back(in.kfac[0]);  // stage 1 its own costs: a 1 x 1 B factor
  in.kfac[1].dim_b = {1};
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  for (const FactorSplit& f : p.splits()) EXPECT_FALSE(f.stage == 1 && f.kind == Kind::INV_B) << f.blocks;
  // Splitting A alone does not shorten device 1's 2 steps (SplitsWhenThatShortensTheRefreshPeriod
  // needed both), so nothing is split: the plan of the base rules.
  EXPECT_EQ(p.refresh_steps, (std::vector<int>{2, 2}));
}

TEST(Planner, SplitsExactlyWhenAUnitExceedsEveryGap) {
  // Inversion A of 3: device 0's gap is 3 (fits exactly, margin 0), device 1's largest is 2:
  // split there into 2 blocks of size 2, each (2/4)^3 of the whole.
  PlanInput in = tiny(3);
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  ASSERT_EQ(p.splits().size(), 1u);
  EXPECT_EQ(p.splits()[0].stage, 1);
  EXPECT_EQ(p.splits()[0].kind, Kind::INV_A);
  EXPECT_EQ(p.splits()[0].blocks, 2);
  EXPECT_DOUBLE_EQ(p.splits()[0].pieces, 2 * 3 * 0.125);  // the block-diagonal cost
  EXPECT_EQ(unit(p, 1, "1INV_Al0b1").end - unit(p, 1, "1INV_Al0b1").start, 0.375);
  EXPECT_NO_THROW(unit(p, 0, "0INV_Al0"));
  EXPECT_EQ(p.inline_time, 0);
  // With a 5% margin device 0's gap no longer takes 3 either.
  in.margin = 0.05;
  EXPECT_EQ(plan_kfac(in).splits().size(), 2u);
  // Uneven blocks: d = 5 in 2 blocks of 3 and 2 rows.
  EXPECT_DOUBLE_EQ(block_cost(125, 5, 2, 0), 27);
  EXPECT_DOUBLE_EQ(block_cost(125, 5, 2, 1), 8);
}

TEST(Planner, NoBubbleMeansEverythingInline) {
  PlanInput in = tiny(1, 1, 2);  // D = 1: F0 F1 B0 B1 PREC, no gap at all
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  EXPECT_EQ(p.refresh_steps, (std::vector<int>{1}));
  EXPECT_EQ(p.lower_bound_refresh_steps, (std::vector<int>{-1}));
  EXPECT_EQ(p.inline_time, 4);  // 4 curvature units of 0.5 and 2 inversions of 1
  EXPECT_EQ(p.step_time, 6 + 0.5 + 4);
  EXPECT_TRUE(p.splits().empty());
  for (const PlacedUnit& u : p.units()) EXPECT_TRUE(u.inline_work);
  EXPECT_EQ(to_text(p.schedule_for(0, 5)).substr(to_text(p.schedule_for(0, 5)).find("\n0:") + 1),
            "0: 0F0 0F1 0B0 0B1 0CURV_A0l0 0CURV_A1l0 0CURV_B0l0 0CURV_B1l0 0INV_Al0 0INV_Bl0 0PREC\n");
}

TEST(Planner, PrioritiesOrderUnitsOfEqualReadiness) {
  // Device 1 of the tiny case: every unit is ready by its tail gap; they run CURV_A, CURV_B,
  // then INV_A, INV_B (the paper's priorities), not in readiness or size order.
  PlanInput in = tiny();
  in.kfac[0].inv_b = {0.25};
  in.kfac[0].inv_a = {0.75};
  KfacPlan p = plan_kfac(in);
  std::vector<std::string> order;
  for (const Action& a : p.actions(0, 1, 1))
    if (is_kfac(a.kind) && a.kind != Kind::PREC) order.push_back(to_token(a));
  // Both inversions wrapped into the leading gap (A first), then this cycle's curvature.
  EXPECT_EQ(order, (std::vector<std::string>{"1INV_Al0", "1INV_Bl0", "1CURV_A0l0", "1CURV_A1l0", "1CURV_B0l0",
                                             "1CURV_B1l0"}));
  const auto& first = p.actions(0, 1, 0);
  std::vector<std::string> step0;
  for (const Action& a : first)
    if (is_kfac(a.kind) && a.kind != Kind::PREC) step0.push_back(to_token(a));
  EXPECT_EQ(step0, (std::vector<std::string>{"1CURV_A0l0", "1CURV_A1l0", "1CURV_B0l0", "1CURV_B1l0"}));
}

TEST(Planner, EveryScheduleGivesAValidPlan) {
  struct Case {
    const char* name;
    int D, N, V;
  };
  for (Case c : {Case{"gpipe", 4, 4, 1}, {"1f1b", 4, 8, 1}, {"interleaved", 2, 4, 2}, {"interleaved", 4, 8, 3},
                 {"chimera", 4, 4, 1}, {"chimera", 4, 8, 1}, {"zb-h1", 4, 4, 1}, {"zb-h2", 4, 8, 1}, {"naive", 3, 2, 1}}) {
    PlanInput in = bert_large("1f1b", c.D, c.N, 1);
    in.schedule = make_schedule(c.name, c.D, c.N, c.V);
    KfacPlan p = plan_kfac(in);
    SCOPED_TRACE(c.name);
    check_plan(in, p);
    for (int d = 0; d < c.D; ++d) {
      EXPECT_GE(p.refresh_steps[d], 1);
      // A lower bound while every step has the same gaps (inline work lengthens step 0).
      if (p.lower_bound_refresh_steps[d] > 0 && !p.common_cycle) EXPECT_GE(p.refresh_steps[d], p.lower_bound_refresh_steps[d]);
    }
    // Chimera: each device fills in the K-FAC work of both of its stages.
    if (std::string(c.name) == "chimera")
      for (int d = 0; d < c.D; ++d) {
        std::set<int> pipes;
        for (const PlacedUnit& u : p.units())
          if (u.device == d) pipes.insert(u.action.pipeline);
        EXPECT_EQ(pipes, (std::set<int>{0, 1}));
      }
    // Zero-bubble: curvature B follows I (the output gradient exists there).
    if (std::string(c.name).starts_with("zb-")) {
      const PlacedUnit& u = unit(p, 3, "3CURV_B0l0");
      double i_end = 0;
      for (const TimedAction& t : p.base.per_device[3])
        if (t.action == act(Kind::I, 3, 0)) i_end = t.end;
      EXPECT_GE(u.start + u.step * p.base_step_time, i_end);
    }
    // Every step's schedule, with its K-FAC actions, round-trips through text and CSV.
    for (int t = 0; t < 3; ++t) {
      Schedule s = p.schedule_for(0, t);
      EXPECT_EQ(to_text(parse_text(to_text(s), "t")), to_text(s));
    }
    Schedule s0 = p.schedule_for(0, 0);
    EXPECT_NO_THROW(validate(s0));
    EXPECT_EQ(to_text(parse_csv(to_csv(s0), "t")), to_text(s0));
  }
}

TEST(Planner, DataAndInversionParallelism) {
  // W = 2: both replicas compute curvature and sync it at the same point; the inversions of a
  // device are shared out (largest first to the least loaded).
  PlanInput in = bert_large("1f1b", 4, 4, 1, 2);
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  for (int d = 0; d < 4; ++d) {
    double inv[2] = {0, 0};
    for (const PlacedUnit& u : p.units())
      if (u.device == d && (u.action.kind == Kind::INV_A || u.action.kind == Kind::INV_B)) inv[u.replica] += u.end - u.start;
    EXPECT_GT(inv[0], 0);
    EXPECT_GT(inv[1], 0);
    const StageKfacCost& c = in.kfac[0];
    double total = 0;
    for (int l = 0; l < c.layers(); ++l) total += c.inv_a[l] + c.inv_b[l];
    for (const FactorSplit& f : p.splits())
      if (f.stage == d) total += f.pieces - f.whole;  // split factors cost their blocks
    EXPECT_NEAR(inv[0] + inv[1], total, 1e-9);
    EXPECT_NEAR(inv[0], inv[1], 2 * *std::max_element(c.inv_a.begin(), c.inv_a.end()));
    const PlacedUnit& s0 = unit(p, d, to_token({Kind::SYNC_CURV, d, 0, -1, -1}), 0);
    const PlacedUnit& s1 = unit(p, d, to_token({Kind::SYNC_CURV, d, 0, -1, -1}), 1);
    EXPECT_EQ(std::tuple(s0.step, s0.start), std::tuple(s1.step, s1.start));
  }
  // Less inversion work per replica: no more steps than with W = 1.
  KfacPlan one = plan_kfac(bert_large("1f1b", 4, 4, 1, 1));
  for (int d = 0; d < 4; ++d) EXPECT_LE(p.kfac_work[d], one.kfac_work[d] + in.kfac[0].sync);
}

TEST(Planner, InversionsPlacedByAlgorithm1) {
  // W = 2 with a broadcast model under which the 1024-wide factors are cheaper to invert than to
  // broadcast (NCT: every replica inverts them) and the 4096-wide ones are not (CT: one owner,
  // then a broadcast): beta between the two thresholds t_inv(d) / bytes(d) (d^3 against d^2).
  PlanInput in = bert_large("1f1b", 4, 4, 1, 2);
  const StageKfacCost& c = in.kfac[0];
  auto bytes = [](double d) { return 4 * d * (d + 1) / 2; };
  const double beta = std::sqrt(c.inv_a[0] / bytes(1024) * (c.inv_a[5] / bytes(4096)));
  in.bcast_alpha = 0;
  in.bcast_beta = beta;
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  ASSERT_EQ(p.placements().size(), 4u);
  int nct = 0, ct = 0;
  for (const StagePlacement& sp : p.placements()) {
    // The same placement from place_load_balanced on dims and costs computed here.
    std::vector<int64_t> dims;
    std::vector<double> inv, bc;
    std::vector<std::string> tokens;
    for (Kind k : {Kind::INV_A, Kind::INV_B})
      for (int l = 0; l < c.layers(); ++l) {
        const int d = k == Kind::INV_A ? c.dim_a[l] : c.dim_b[l];
        const double whole = k == Kind::INV_A ? c.inv_a[l] : c.inv_b[l];
        int blocks = 1;
        for (const FactorSplit& f : p.splits())
          if (f.stage == sp.stage && f.layer == l && f.kind == k) blocks = f.blocks;
        for (int j = 0; j < blocks; ++j) {
          const int64_t n = blocks == 1 ? d : d / blocks + (j < d % blocks ? 1 : 0);
          dims.push_back(n);
          inv.push_back(blocks == 1 ? whole : block_cost(whole, d, blocks, j));
          bc.push_back(beta * bytes(static_cast<double>(n)));
          tokens.push_back(to_token({k, sp.stage, 0, -1, l, blocks == 1 ? -1 : j}));
        }
      }
    const InversionPlacement want = place_load_balanced(dims, 2, inv, bc);
    ASSERT_EQ(sp.pieces.size(), tokens.size());
    for (size_t k = 0; k < tokens.size(); ++k) {
      const int owner = sp.owner_of(parse_token(tokens[k], "t"));
      EXPECT_EQ(owner, want.owner[k]) << tokens[k];
      // 1024-wide: NCT; 4096-wide (whole): CT.
      if (dims[k] == 1024) EXPECT_EQ(owner, kEveryRank) << tokens[k];
      if (dims[k] == 4096) EXPECT_NE(owner, kEveryRank) << tokens[k];
      (owner == kEveryRank ? nct : ct) += 1;
    }
    EXPECT_EQ(sp.placement.load, want.load);
  }
  EXPECT_GT(nct, 0);
  EXPECT_GT(ct, 0);
  // Broadcasts in the plan: one unit per CT piece on each replica, before the stage's sync.
  int bcasts = 0;
  for (const PlacedUnit& u : p.units()) bcasts += is_bcast_inv(u.action.kind);
  EXPECT_EQ(bcasts, 2 * ct);
}

TEST(Planner, MeasuredDurationsPerAction) {
  // The runtime's input: durations per action of the schedule instead of a cost model.
  PlanInput in = tiny();
  in.durations = {{1, 1, 2, 2}, {1, 1, 2, 2}};
  in.cost.stages[0].forward = 100;  // ignored
  KfacPlan p = plan_kfac(in);
  EXPECT_EQ(p.base_step_time, 9.5);
  in.durations[0].pop_back();
  EXPECT_THROW(plan_kfac(in), UsageError);
}

TEST(Planner, SplitInversionTokensRoundTrip) {
  Action a{Kind::INV_B, 2, 1, -1, 4, 3};
  EXPECT_EQ(to_token(a), "2INV_Bp1l4b3");
  EXPECT_EQ(parse_token("2INV_Bp1l4b3", "t"), a);
  EXPECT_EQ(parse_token("2INV_Al4", "t").block, -1);
}

TEST(Planner, ShapesSplitCostsByDSquaredAndDCubed) {
  auto bert = block_linears("bert", 2, 8);  // q k v o: 2x2, intermediate 2->8, output 8->2
  StageKfacCost c = split_stage_cost(bert, 84, 1104, 1);
  // sum of squares: A 4*4 + 4 + 64 = 84, B the same: 168 -> 0.5 per unit of d^2.
  EXPECT_DOUBLE_EQ(c.curv_a[0], 2);
  EXPECT_DOUBLE_EQ(c.curv_a[5], 32);
  EXPECT_DOUBLE_EQ(c.curv_b[4], 32);
  // cubes: A 4*8 + 8 + 512 = 552, B the same: 1104 -> 1 per unit of d^3.
  EXPECT_DOUBLE_EQ(c.inv_b[4], 512);
  EXPECT_DOUBLE_EQ(c.inv_a[0], 8);
  auto gpt = block_linears("gpt", 2, 8);
  EXPECT_EQ(gpt[0].d_out, 6);
  EXPECT_THROW(block_linears("t5", 2, 8), UsageError);
}


namespace {
// Chimera: the twins (devices i and D-1-i hold stages i and D-1-i, one of each pipeline) sync at
// one point: the end of cycle step K, in stage order, after every other action of that step; all
// devices share one cycle; the twins split the same factors into the same blocks.
void expect_chimera_syncs(const PlanInput& in, const std::string& what) {
  SCOPED_TRACE(what);
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  const int D = p.devices;
  ASSERT_GE(p.sync_step, 0);
  // Without the group one cycle for all; with it one per pair of twins (unless inline work).
  if (!in.chimera_group) EXPECT_TRUE(p.common_cycle);
  for (int d = 0; d < D; ++d) {
    const int K = p.sync_steps[d];
    EXPECT_EQ(K, in.chimera_group ? p.sync_steps[D - 1 - d] : p.sync_step);
    EXPECT_EQ(p.refresh_steps[d], p.refresh_steps[in.chimera_group ? D - 1 - d : 0]);
    EXPECT_GT(p.refresh_steps[d], K);
    for (int w = 0; w < p.replicas; ++w) {
      const auto& list = p.cycle_actions(w, d, K);
      // The list's tail: per stage (stage order) its broadcasts (W > 1) then its sync, then only
      // the inversions that fit no gap (pinned after them).
      size_t pinned_inv = 0, pinned_bcast = 0;
      for (const PlacedUnit& u : p.units())
        if (u.replica == w && u.device == d && u.at_step_end) {
          pinned_bcast += is_bcast_inv(u.action.kind);
          pinned_inv += u.action.kind == Kind::INV_A || u.action.kind == Kind::INV_B;
        }
      if (p.replicas == 1 && !in.chimera_group) EXPECT_EQ(pinned_bcast, 0u);
      ASSERT_GE(list.size(), 2 + pinned_bcast + pinned_inv);
      const size_t tail = list.size() - 2 - pinned_bcast - pinned_inv;
      std::vector<int> sync_stages;
      for (size_t i = tail; i < list.size() - pinned_inv; ++i) {
        const Action& x = list[i];
        ASSERT_TRUE(x.kind == Kind::SYNC_CURV || is_bcast_inv(x.kind)) << to_token(x);
        if (x.kind == Kind::SYNC_CURV) sync_stages.push_back(x.stage);
        else EXPECT_TRUE(sync_stages.empty() || sync_stages.back() < x.stage) << "broadcast after its sync";
      }
      for (size_t i = list.size() - pinned_inv; i < list.size(); ++i)
        EXPECT_TRUE(list[i].kind == Kind::INV_A || list[i].kind == Kind::INV_B) << to_token(list[i]);
      ASSERT_EQ(sync_stages.size(), 2u);
      EXPECT_EQ(std::set<int>(sync_stages.begin(), sync_stages.end()), std::set<int>({d, D - 1 - d}));
      EXPECT_LT(sync_stages[0], sync_stages[1]);
      // No sync anywhere else in the cycle.
      int syncs = 0;
      for (int k = 0; k < p.refresh_steps[d]; ++k)
        for (const Action& x : p.cycle_actions(w, d, k)) syncs += x.kind == Kind::SYNC_CURV;
      EXPECT_EQ(syncs, 2);
      // Every inversion after the syncs: in a later cycle step (or wrapped into the next cycle).
      for (const PlacedUnit& u : p.units())
        if (u.replica == w && u.device == d && (u.action.kind == Kind::INV_A || u.action.kind == Kind::INV_B))
          EXPECT_TRUE(u.wrapped || u.step > K || u.at_step_end) << to_token(u.action);
    }
  }
  // Twins split alike: (stage, layer, kind) -> blocks is the same for both pipelines.
  std::map<std::tuple<int, int, int>, std::set<int>> blocks;
  for (const FactorSplit& f : p.splits()) blocks[{f.stage, f.layer, static_cast<int>(f.kind)}].insert(f.pipeline);
  for (auto& [k, pipes] : blocks) EXPECT_EQ(pipes, (std::set<int>{0, 1}));
}
}  // namespace

TEST(Planner, ChimeraTwinsSyncTogetherAtTheEndOfOneCycleStep) {
  for (bool group : {true, false})
    for (int D : {2, 4}) {
      PlanInput in = bert_large("1f1b", D, 8, 24 / D);
      in.schedule = make_schedule("chimera", D, 8);
      in.chimera_group = group;
      expect_chimera_syncs(in, "chimera D=" + std::to_string(D) + (group ? " group" : ""));
    }
  for (bool group : {true, false}) {
    PlanInput in = bert_large("1f1b", 4, 8, 6, 2);
    in.schedule = make_schedule("chimera", 4, 8);
    in.chimera_group = group;
    expect_chimera_syncs(in, std::string("chimera D=4 W=2") + (group ? " group" : ""));
  }
}


TEST(Planner, ChimeraGroupTwinsShareTheInversions) {
  // W = 1, no broadcast cost: every piece is CT (Algorithm 1 over the 2 holders of a stage, the
  // twins i and D-1-i): each piece inverted by exactly one twin, both broadcast it, and the
  // placement is place_load_balanced's on the stage's pieces.
  PlanInput in = bert_large("1f1b", 4, 8, 6);
  in.schedule = make_schedule("chimera", 4, 8);
  KfacPlan p = plan_kfac(in);
  check_plan(in, p);
  const StageKfacCost& c = in.kfac[0];
  double stage_inv = 0;
  for (int l = 0; l < c.layers(); ++l) stage_inv += c.inv_a[l] + c.inv_b[l];
  ASSERT_EQ(p.placements().size(), 8u);  // 4 devices x 2 hosted stages
  for (const StagePlacement& sp : p.placements()) {
    ASSERT_EQ(sp.members.size(), 2u);
    const int twin = 3 - sp.device;
    // Members: pipeline 0's copy then pipeline 1's.
    EXPECT_EQ(sp.members[0], std::pair(sp.stage, 0));
    EXPECT_EQ(sp.members[1], std::pair(3 - sp.stage, 0));
    EXPECT_TRUE(sp.members[sp.pipeline].first == sp.device && sp.members[1 - sp.pipeline].first == twin);
    const InversionPlacement want = place_load_balanced(sp.dims, 2, sp.inv_time, sp.bcast_time);
    EXPECT_EQ(sp.placement.owner, want.owner);
    EXPECT_EQ(sp.placement.communicated(), static_cast<int>(sp.pieces.size()));
    // Each piece once over the twins: the stage's inversion work once, not twice.
    double here = 0, there = 0;
    for (const PlacedUnit& u : p.units())
      if (u.action.stage == sp.stage && (u.action.kind == Kind::INV_A || u.action.kind == Kind::INV_B))
        (u.device == sp.device ? here : there) += u.end - u.start;
    EXPECT_NEAR(here + there, stage_inv, 1e-9);
    EXPECT_GT(here, 0);
    EXPECT_GT(there, 0);
  }
  // Per device: the curvature of its N micro-batches plus about one stage's inversions (half of
  // each of its two stages'), not two.
  for (int d = 0; d < 4; ++d) {
    double curv = 0;
    for (int l = 0; l < c.layers(); ++l) curv += 8 * (c.curv_a[l] + c.curv_b[l]);
    EXPECT_LT(p.kfac_work[d], curv + 1.2 * stage_inv);
    EXPECT_GT(p.kfac_work[d], curv + 0.8 * stage_inv);
  }
  // Without the group each copy inverts all of its stage's factors.
  in.chimera_group = false;
  KfacPlan alone = plan_kfac(in);
  EXPECT_TRUE(alone.placements().empty());
  for (int d = 0; d < 4; ++d) EXPECT_GT(alone.kfac_work[d], p.kfac_work[d] + 0.5 * stage_inv);
}

}  // namespace
}  // namespace pf

namespace pf {
namespace {

using namespace planner_test;

// The plans the query tests look at: a wrapped unit (tiny), replicas sharing inversions
// (1F1B W = 2), Chimera's twins sharing them with overlapped cycles (D = 4, N = 8).
std::vector<std::pair<std::string, PlanInput>> query_inputs() {
  PlanInput wrapped = tiny(0.5);
  wrapped.kfac[0].inv_b = {0.5};
  PlanInput chimera = bert_large("1f1b", 4, 8, 6);
  chimera.schedule = make_schedule("chimera", 4, 8);
  return {{"tiny", wrapped}, {"1f1b W=2", bert_large("1f1b", 4, 4, 1, 2)}, {"chimera", chimera}};
}

TEST(PlanQueries, ListsEndWithOneOptimizerStepPerHostedStage) {
  // The runtime hands the planner its lowered step, OPTs included: every list of the plan ends
  // with exactly the device's OPTs (one per hosted stage, in the step's order), and apart from
  // them the plan is the plan of the step without OPTs.
  for (auto [name, in] : query_inputs()) {
    const KfacPlan plain = plan_kfac(in);
    PlanInput with_opt = in;
    with_opt.schedule = lower_communication(in.schedule, {.grad_sync = false, .optimizer = true});
    PlanInput without = with_opt;
    for (auto& row : without.schedule.per_device) std::erase_if(row, [](const Action& a) { return a.kind == Kind::OPT; });
    const KfacPlan p = plan_kfac(with_opt), q = plan_kfac(without);
    EXPECT_EQ(p.refresh_steps, q.refresh_steps) << name;
    for (int w = 0; w < in.replicas; ++w)
      for (int d = 0; d < in.schedule.devices; ++d) {
        std::vector<Action> opts;
        for (const Action& a : with_opt.schedule.per_device[d])
          if (a.kind == Kind::OPT) opts.push_back(a);
        std::set<std::pair<int, int>> hosted;
        for (const Action& a : in.schedule.per_device[d]) hosted.insert({a.pipeline, a.stage});
        ASSERT_EQ(opts.size(), hosted.size()) << name;
        for (int64_t t = 0; t < 3 * p.refresh_steps[d]; ++t) {
          const std::vector<Action>& list = p.actions(w, d, t);
          ASSERT_GE(list.size(), opts.size());
          EXPECT_EQ(std::vector<Action>(list.end() - static_cast<std::ptrdiff_t>(opts.size()), list.end()), opts)
              << name << " device " << d << " step " << t;
          EXPECT_EQ(std::count_if(list.begin(), list.end(), [](const Action& a) { return a.kind == Kind::OPT; }),
                    static_cast<std::ptrdiff_t>(opts.size()));
          EXPECT_EQ(std::vector<Action>(list.begin(), list.end() - static_cast<std::ptrdiff_t>(opts.size())),
                    q.actions(w, d, t))
              << name << " device " << d << " step " << t;
        }
      }
    EXPECT_EQ(p.refresh_steps, plain.refresh_steps) << name;
  }
}

TEST(PlanQueries, WrappedUnitsAreTheSteadyStateListMinusTheFirstCycle) {
  int wrapped_seen = 0;
  for (auto [name, in] : query_inputs()) {
    const KfacPlan p = plan_kfac(in);
    for (int w = 0; w < in.replicas; ++w)
      for (int d = 0; d < in.schedule.devices; ++d) {
        const int R = p.refresh_steps[d];
        for (int k = 0; k < R; ++k) {
          // Steady state = first cycle + wrapped (as multisets), and wrapped = the placed units
          // marked wrapped in this cycle step.
          std::multiset<std::string> steady, first_plus_wrapped, wrapped, placed;
          for (const Action& a : p.actions(w, d, R + k)) steady.insert(to_token(a));
          for (const Action& a : p.actions(w, d, k)) first_plus_wrapped.insert(to_token(a));
          for (const Action& a : p.wrapped(w, d, k)) first_plus_wrapped.insert(to_token(a)), wrapped.insert(to_token(a));
          for (const PlacedUnit& u : p.units())
            if (u.replica == w && u.device == d && u.step == k && u.wrapped) placed.insert(to_token(u.action));
          EXPECT_EQ(steady, first_plus_wrapped) << name << " device " << d << " cycle step " << k;
          EXPECT_EQ(wrapped, placed) << name << " device " << d << " cycle step " << k;
          wrapped_seen += static_cast<int>(wrapped.size());
        }
      }
  }
  EXPECT_GT(wrapped_seen, 0);  // the inputs do wrap units
}

TEST(PlanQueries, InverterIsTheOnlyHolderListingThePiece) {
  // A piece with an inverter is inverted by that holder alone (once per cycle) and broadcast by
  // every holder of its stage; a piece without one is inverted by every holder.
  for (auto [name, in] : query_inputs()) {
    if (name == "tiny") continue;  // one holder per stage: nothing to share
    const KfacPlan p = plan_kfac(in);
    int shared = 0;
    for (const StagePlacement& sp : p.placements())
      for (const Action& piece : sp.pieces) {
        const auto owner = p.inverter(piece);
        const Action bcast{piece.kind == Kind::INV_A ? Kind::BCAST_INV_A : Kind::BCAST_INV_B, piece.stage, piece.pipeline,
                           -1, piece.layer, piece.block};
        for (auto [d, w] : sp.members) {
          int inverts = 0, broadcasts = 0;
          for (int k = 0; k < p.refresh_steps[d]; ++k)
            for (const Action& a : p.actions(w, d, p.refresh_steps[d] + k)) {
              // Chimera's twin lists the piece under its own pipeline copy.
              const bool same = a.stage == piece.stage && a.layer == piece.layer && a.block == piece.block &&
                                in.schedule.device_of(a.pipeline, a.stage) == d;
              inverts += same && a.kind == piece.kind;
              broadcasts += same && a.kind == bcast.kind;
            }
          const bool mine = !owner || *owner == std::pair{d, w};
          EXPECT_EQ(inverts, mine ? 1 : 0) << name << " " << to_token(piece) << " device " << d << " replica " << w;
          EXPECT_EQ(broadcasts, owner ? 1 : 0) << name << " " << to_token(piece) << " device " << d << " replica " << w;
        }
        shared += owner.has_value();
      }
    EXPECT_GT(shared, 0) << name;
  }
}

}  // namespace
}  // namespace pf
