#pragma once
// The planner tests' inputs and the property check every plan must pass (test_planner*.cpp).
#include "schedule/generators.hpp"
#include "plan/planner.hpp"
#include "sim/profile.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace pf::planner_test {

// The paper's code's BERT-Large V100 profile (micro-batch 32), per transformer block, ms.
constexpr double kTf = 10.39, kTb = 16.28, kTcurv = 27.45, kTinv = 80.85, kTprec = 8.90;

inline PlanInput bert_large(const std::string& schedule, int D, int N, int blocks_per_stage, int W = 1) {
  PlanInput in;
  in.schedule = make_schedule(schedule, D, N);
  const int L = blocks_per_stage;
  in.cost.stages[0].forward = L * kTf;
  in.cost.stages[0].backward = L * kTb;
  std::vector<LinearShape> layers;
  for (int b = 0; b < L; ++b)
    for (const LinearShape& s : block_linears("bert", 1024, 4096)) layers.push_back(s);
  in.kfac = {split_stage_cost(layers, L * kTcurv, L * kTinv, L * kTprec, 5.0)};
  in.replicas = W;
  return in;
}

inline bool occupying(Kind k) { return !is_p2p(k); }

// Holders of a stage: W replicas, times 2 with Chimera's stage group.
inline int holders(const PlanInput& in) {
  return in.replicas * (in.schedule.pipelines > 1 && in.chimera_group ? in.schedule.pipelines : 1);
}

// Every property a plan must have, checked against the plan's own timelines.
inline void check_plan(const PlanInput& in, const KfacPlan& plan) {
  const Schedule& s = in.schedule;
  const int D = s.devices, W = in.replicas;
  // Every replica of a device posts its collectives (broadcasts, syncs) in the same order: blocking
  // collectives on the stage's communicator must not cross.
  for (int d = 0; d < D; ++d)
    for (int k = 0; k < plan.refresh_steps[d]; ++k) {
      std::vector<std::string> first;
      for (int w = 0; w < W; ++w) {
        std::vector<std::string> coll;
        for (const Action& a : plan.cycle_actions(w, d, k))
          if (a.kind == Kind::SYNC_CURV || is_bcast_inv(a.kind)) coll.push_back(to_token(a));
        if (w == 0) first = coll;
        EXPECT_EQ(coll, first) << "device " << d << " cycle step " << k << " replica " << w;
      }
    }
  auto offset = [&](int k) { return k == 0 ? 0.0 : plan.step0_time + (k - 1) * plan.base_step_time; };
  // Expected units per device (one cycle, all replicas together).
  for (int d = 0; d < D; ++d) {
    std::multiset<std::string> expect, got;
    std::set<std::pair<int, int>> stages;
    for (const Action& a : s.per_device[d]) {
      const StageKfacCost& c = in.kfac.size() == 1 ? in.kfac[0] : in.kfac[a.stage];
      if (a.kind == Kind::F) stages.insert({a.pipeline, a.stage});
      if (a.kind == Kind::F || a.kind == Kind::B || a.kind == Kind::I)
        for (int l = 0; l < c.layers(); ++l)
          for (int w = 0; w < W; ++w)
            expect.insert(to_token({a.kind == Kind::F ? Kind::CURV_A : Kind::CURV_B, a.stage, a.pipeline, a.micro_batch, l}));
    }
    for (auto [p, st] : stages) {
      const StageKfacCost& c = in.kfac.size() == 1 ? in.kfac[0] : in.kfac[st];
      if (W > 1 || s.pipelines > 1)
        for (int w = 0; w < W; ++w) expect.insert(to_token({Kind::SYNC_CURV, st, p, -1, -1}));
      // W > 1: an NCT piece is inverted by every replica; a CT piece by its owner, and
      // broadcast on every replica (plan.placements(), checked in InversionsPlacedByAlgorithm1).
      // Chimera's group: the pieces are shared by the twins too (members are (device, replica)).
      const StagePlacement* sp = nullptr;
      for (const StagePlacement& x : plan.placements())
        if (x.pipeline == p && x.stage == st && x.device == d) sp = &x;
      ASSERT_EQ(sp != nullptr, W > 1 || (s.pipelines > 1 && in.chimera_group)) << "device " << d;
      for (Kind k : {Kind::INV_A, Kind::INV_B})
        for (int l = 0; l < c.layers(); ++l) {
          int blocks = 1;
          for (const FactorSplit& f : plan.splits())
            if (f.pipeline == p && f.stage == st && f.layer == l && f.kind == k) blocks = f.blocks;
          for (int j = 0; j < blocks; ++j) {
            const Action inv{k, st, p, -1, l, blocks > 1 ? j : -1};
            const int owner = sp ? sp->owner_of(inv) : kEveryRank;
            const bool here = owner == kEveryRank || sp->members[owner].first == d;
            for (int w = 0; w < (owner == kEveryRank ? W : here ? 1 : 0); ++w) expect.insert(to_token(inv));
            if (owner == kEveryRank) continue;
            for (int w = 0; w < W; ++w)
              expect.insert(to_token({k == Kind::INV_A ? Kind::BCAST_INV_A : Kind::BCAST_INV_B, st, p, -1, l, inv.block}));
            for (const PlacedUnit& u : plan.units())
              if (u.device == d && u.action == inv) {
                EXPECT_EQ(u.replica, sp->members[owner].second) << to_token(inv);
              }
          }
        }
    }
    for (const PlacedUnit& u : plan.units())
      if (u.device == d) got.insert(to_token(u.action));
    ASSERT_EQ(got, expect) << "device " << d;
  }
  // Per replica and device: in a gap of its step's timeline, no overlap, dependencies by time.
  for (int w = 0; w < W; ++w)
    for (int d = 0; d < D; ++d) {
      const int R = plan.refresh_steps[d];
      std::map<std::string, double> end_abs;   // unit token -> absolute end in the cycle
      std::vector<const PlacedUnit*> mine;
      for (const PlacedUnit& u : plan.units())
        if (u.replica == w && u.device == d) mine.push_back(&u);
      // A wrapped unit runs in the next cycle's step u.step (its leading gap of step 0, or with
      // Chimera's group up to its sync step): absolute time from this cycle's start.
      auto abs_start = [&](const PlacedUnit& u) { return offset(u.wrapped ? R + u.step : u.step) + u.start; };
      for (const PlacedUnit* u : mine) end_abs[to_token(u->action)] = abs_start(*u) + (u->end - u->start);
      // No overlap in the steady state: wrapped units share the cycle step's gaps with its own.
      std::sort(mine.begin(), mine.end(), [&](auto* a, auto* b) { return offset(a->step) + a->start < offset(b->step) + b->start; });
      double prev_end = -1;
      std::string prev;
      // Chimera's pinned units lengthen their step (on the critical path): not in a gap.
      for (const PlacedUnit* u : mine) {
        if (u->at_step_end) continue;
        EXPECT_GE(offset(u->step) + u->start + 1e-9, prev_end)
            << "K-FAC units overlap on device " << d << ": " << to_token(u->action) << " step " << u->step
            << (u->wrapped ? " wrapped" : "") << (u->inline_work ? " inline" : "") << " after " << prev;
        prev_end = offset(u->step) + u->end;
        prev = to_token(u->action) + " step " + std::to_string(u->step) + (u->wrapped ? " wrapped" : "");
        if (u->inline_work) continue;
        const Timeline& tl = u->step == 0 && !u->wrapped ? plan.step0 : plan.base;
        EXPECT_GE(u->start, -1e-9);
        EXPECT_LE(u->end, tl.step_time + 1e-9);
        for (const TimedAction& t : tl.per_device[d])
          if (occupying(t.action.kind) && t.end > t.start)
            EXPECT_TRUE(u->end <= t.start + 1e-9 || u->start >= t.end - 1e-9)
                << to_token(u->action) << " overlaps " << to_token(t.action) << " on device " << d;
        if (u->wrapped && !(s.pipelines > 1 && in.chimera_group))
          EXPECT_LT(u->end, plan.base.per_device[d].front().end + 1e-9);
      }
      // Dependencies (absolute times in the cycle; curvature from step 0's F/B).
      auto step0_end = [&](Kind k, const Action& a) {
        for (const TimedAction& t : plan.step0.per_device[d])
          if ((t.action.kind == k || (k == Kind::B && t.action.kind == Kind::I)) && t.action.stage == a.stage &&
              t.action.pipeline == a.pipeline && t.action.micro_batch == a.micro_batch)
            return t.end;
        ADD_FAILURE() << "no source for " << to_token(a);
        return 0.0;
      };
      for (const PlacedUnit* u : mine) {
        const Action& a = u->action;
        const double st = abs_start(*u);
        if (a.kind == Kind::CURV_A) EXPECT_GE(st + 1e-9, step0_end(Kind::F, a)) << to_token(a);
        if (a.kind == Kind::CURV_B) EXPECT_GE(st + 1e-9, step0_end(Kind::B, a)) << to_token(a);
        if (a.kind == Kind::SYNC_CURV || a.kind == Kind::INV_A || a.kind == Kind::INV_B)
          for (const PlacedUnit* v : mine) {
            const Action& b = v->action;
            if (b.stage != a.stage || b.pipeline != a.pipeline) continue;
            // The sync after the stage's broadcasts (of the previous cycle's inverses).
            bool dep = a.kind == Kind::SYNC_CURV ? (b.kind == Kind::CURV_A || b.kind == Kind::CURV_B || is_bcast_inv(b.kind))
                                                 : (b.kind == Kind::SYNC_CURV ||
                                                    (b.kind == (a.kind == Kind::INV_A ? Kind::CURV_A : Kind::CURV_B) &&
                                                     b.layer == a.layer));
            if (dep) EXPECT_GE(st + 1e-9, end_abs[to_token(b)]) << to_token(a) << " before " << to_token(b);
          }
      }
      // Action lists: the step's own actions in their order, plus this cycle step's gap units
      // in the order of their start times.
      for (int k = 0; k < R; ++k) {
        const auto& list = plan.cycle_actions(w, d, k);
        std::map<std::string, double> unit_start;
        for (const PlacedUnit* u : mine)
          if (u->step == k && (!u->inline_work || u->at_step_end)) unit_start[to_token(u->action)] = u->start;
        std::vector<Action> own;
        double last = -1;
        for (const Action& a : list) {
          auto it = unit_start.find(to_token(a));
          if (it == unit_start.end()) {
            own.push_back(a);
            continue;
          }
          EXPECT_GE(it->second + 1e-9, last) << "list order != time order on device " << d << " step " << k;
          last = it->second;
          unit_start.erase(it);
        }
        EXPECT_TRUE(unit_start.empty()) << "units missing from the list of device " << d << " step " << k;
        const Timeline& tl = k == 0 ? plan.step0 : plan.base;
        ASSERT_EQ(own.size(), tl.per_device[d].size());
        for (size_t i = 0; i < own.size(); ++i)
          if (!(is_collective(own[i].kind) && tl.per_device[d][i].action.kind == Kind::PREC))
            EXPECT_EQ(own[i], tl.per_device[d][i].action) << "device " << d << " step " << k << " at " << i;
      }
    }
  // Every PREC of the base step lasts its device's share of a split precondition (the busiest
  // replica's), else the whole stage's; a stage with several holders has its split.
  EXPECT_EQ(plan.prec_splits.empty(), holders(in) == 1);
  for (int d = 0; d < D; ++d)
    for (const TimedAction& t : plan.base.per_device[d]) {
      if (t.action.kind != Kind::PREC) continue;
      const PrecSplit* ps = plan.prec_split(t.action.pipeline, t.action.stage);
      double want = (in.kfac.size() == 1 ? in.kfac[0] : in.kfac[t.action.stage]).precondition;
      if (ps) {
        want = 0;
        for (size_t m = 0; m < ps->members.size(); ++m)
          if (ps->members[m].first == d) want = std::max(want, ps->time[m]);
      }
      EXPECT_NEAR(t.end - t.start, want, 1e-9) << to_token(t.action) << " on device " << d;
    }
}

// D = 2, N = 2 GPipe, T_f 1, T_b 2, one layer: curvature 0.5 per factor, inversion 1 (or
// inv_a), precondition 0.5, no margin. By hand: device 0 runs F0 [0,1] F1 [1,2] B0 [5,7] B1 [7,9]
// then PREC [9,9.5] (no gap after B1); device 1 F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7], PREC in its
// tail gap [7,7.5]. Step 9.5. Gaps: device 0 [2,5); device 1 [0,1) (leading) and [7.5,9.5).
inline PlanInput tiny(double inv_a = 1, int D = 2, int N = 2) {
  PlanInput in;
  in.schedule = make_gpipe(D, N);
  in.cost.stages[0].forward = 1;
  in.cost.stages[0].backward = 2;
  StageKfacCost c;
  c.curv_a = {0.5};
  c.curv_b = {0.5};
  c.inv_a = {inv_a};
  c.inv_b = {1};
  c.dim_a = {4};
  c.dim_b = {4};
  c.precondition = 0.5;
  in.kfac = {c};
  in.margin = 0;
  return in;
}

inline const PlacedUnit& unit(const KfacPlan& p, int d, const std::string& token, int replica = 0) {
  for (const PlacedUnit& u : p.units())
    if (u.device == d && u.replica == replica && to_token(u.action) == token) return u;
  throw std::runtime_error("no unit " + token);
}

// The paper's published per-block profiles (data/profiles), as `plan --profile` reads them.
inline PlanInput paper_setting(const std::string& file, const std::string& schedule, int D, int N, int blocks,
                        const std::string& arch_size, int W = 1) {
  const std::vector<ProfileRow> rows = read_paper_csv(std::string(PF_SOURCE_DIR) + "/data/profiles/" + file);
  const ProfileRow* row = nullptr;
  for (const ProfileRow& r : rows)
    if (r.bs == 32) row = &r;
  if (!row) throw std::runtime_error("no bs 32 in " + file);
  const Profile prof = profile_from_row(*row, blocks);
  PlanInput in;
  in.schedule = make_schedule(schedule, D, N, 2, prof.cost.stages[0].forward, prof.cost.stages[0].backward);
  in.cost = prof.cost;
  const int hidden = arch_size == "large" ? 1024 : 768;
  std::vector<LinearShape> layers;
  for (int b = 0; b < blocks; ++b)
    for (const LinearShape& l : block_linears("bert", hidden, 4 * hidden)) layers.push_back(l);
  const StageCost& sc = prof.cost.stages[0];
  in.kfac = {split_stage_cost(layers, sc.curvature, sc.inversion, sc.precondition)};
  in.replicas = W;
  return in;
}

inline double plain_step(const PlanInput& in) { return simulate(in.schedule, in.cost).step_time; }

}  // namespace pf::planner_test
