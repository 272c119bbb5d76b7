// The K-FAC graph (schedule/kfac_graph.hpp) against brute-force readings of planned steps of 1F1B
// (one and two replicas), Chimera and zero-bubble H1: every unit's predecessors as the simulator
// resolves them (deps.cpp), every floating unit's window as the adaptive filler gets it, and the
// planner's units as it makes them, each equal to what a scan of the whole list by the rules
// gives; and no window lets a unit pass what it reads or what reads it.
#include "plan/plan_state.hpp"
#include "planner_fixtures.hpp"
#include "schedule/deps.hpp"
#include "schedule/kfac_graph.hpp"
#include "schedule/lower.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace pf {
namespace {

using planner_test::bert_large;

// The rules of kfac_graph.hpp, written as a predicate: does unit `u` read action `a`?
bool reads(const Action& u, const Action& a, bool recompute) {
  if (a.pipeline != u.pipeline || a.stage != u.stage) return false;
  const bool same_mb = a.micro_batch == u.micro_batch, input_grad = a.kind == Kind::B || a.kind == Kind::I;
  switch (u.kind) {
    case Kind::CURV_A: return same_mb && (recompute ? input_grad : a.kind == Kind::F);
    case Kind::CURV_B: return same_mb && input_grad;
    case Kind::SYNC_CURV: return a.kind == Kind::CURV_A || a.kind == Kind::CURV_B;
    case Kind::INV_A: return (a.kind == Kind::CURV_A && a.layer == u.layer) || a.kind == Kind::SYNC_CURV;
    case Kind::INV_B: return (a.kind == Kind::CURV_B && a.layer == u.layer) || a.kind == Kind::SYNC_CURV;
    case Kind::PREC: return a.kind == Kind::B || a.kind == Kind::W || a.kind == Kind::ALLREDUCE;
    default: return false;
  }
}

// The window table of kfac_graph.hpp: may floating unit `u` not pass action `a`?
bool bound(const Action& a, const Action& u) {
  const bool chunk = a.pipeline == u.pipeline && a.stage == u.stage;
  const bool curvature = u.kind == Kind::CURV_A || u.kind == Kind::CURV_B;
  const bool pass = a.kind == Kind::F || a.kind == Kind::B || a.kind == Kind::I || a.kind == Kind::W;
  return a.kind == Kind::OPT ||
         (chunk && (a.kind == Kind::SYNC_CURV || a.kind == Kind::PREC || a.kind == Kind::BCAST_INV_A ||
                    a.kind == Kind::BCAST_INV_B || (curvature && pass)));
}

bool moves(Kind k) { return k == Kind::CURV_A || k == Kind::CURV_B || k == Kind::INV_A || k == Kind::INV_B; }
bool same_layer(const Action& a, const Action& b) {
  return moves(a.kind) && a.pipeline == b.pipeline && a.stage == b.stage && a.layer == b.layer;
}

struct Case {
  const char* schedule;
  int devices, micro_batches, replicas;
  double kfac_scale = 1;  // < 1: a cycle of one step (a sync and its inversions in one list)
};

PlanInput lowered(const Case& c) {
  PlanInput in = bert_large(c.schedule, c.devices, c.micro_batches, 1, c.replicas);
  in.schedule = lower_communication(in.schedule, {.grad_sync = true, .optimizer = true});
  in.kfac = {planner_cost(in.kfac[0], c.kfac_scale)};
  return in;
}

constexpr Case kCases[] = {{"1f1b", 2, 4, 1}, {"1f1b", 2, 4, 2}, {"1f1b", 2, 4, 2, 0.02}, {"chimera", 4, 4, 1},
                           {"zb-h1", 2, 4, 1}};

std::string where(const Case& c, int replica, int64_t t, int d, size_t i, const Action& a) {
  return std::string(c.schedule) + " W=" + std::to_string(c.replicas) + " x" + std::to_string(c.kfac_scale) +
         " replica " + std::to_string(replica) +
         " step " + std::to_string(t) + " device " + std::to_string(d) + " index " + std::to_string(i) + " " + to_token(a);
}

}  // namespace

// What the simulator makes each K-FAC unit of a planned step wait for is every action of the
// whole step (any device) that the unit reads.
TEST(KfacGraph, PredecessorsOfEveryPlannedUnitAreWhatItReads) {
  for (const Case& c : kCases) {
    const PlanInput in = lowered(c);
    const KfacPlan plan = plan_kfac(in);
    int units = 0;
    for (int w = 0; w < c.replicas; ++w)
      for (int64_t t = 0; t < 2 * plan.period(); ++t) {
        const Schedule s = plan.schedule_for(w, t);
        const Dependencies deps = build_dependencies(s);
        for (int d = 0; d < s.devices; ++d)
          for (size_t i = 0; i < s.per_device[d].size(); ++i) {
            const Action& u = s.per_device[d][i];
            if (!is_kfac(u.kind)) continue;
            std::vector<ActionRef> want;
            for (int e = 0; e < s.devices; ++e)
              for (size_t j = 0; j < s.per_device[e].size(); ++j)
                if (reads(u, s.per_device[e][j], false)) want.push_back({e, static_cast<int>(j)});
            std::vector<ActionRef> got = deps.waits_for[d][i];
            auto order = [](const ActionRef& a, const ActionRef& b) {
              return std::pair{a.device, a.index} < std::pair{b.device, b.index};
            };
            std::sort(got.begin(), got.end(), order);
            EXPECT_EQ(got, want) << where(c, w, t, d, i, u);
            ++units;
          }
      }
    EXPECT_GT(units, 0) << c.schedule;
  }
}

// Every floating unit of every planned list: its window is the nearest bounds around it, closed
// no later than its layer's later units' windows, and no action it reads lies inside it before
// it, nor one that reads it inside it after it.
TEST(KfacGraph, WindowsOfEveryPlannedUnitAreTheBoundsAroundItAndKeepItsReads) {
  for (const Case& c : kCases) {
    const PlanInput in = lowered(c);
    const KfacPlan plan = plan_kfac(in);
    int floating = 0;
    for (int w = 0; w < c.replicas; ++w)
      for (int d = 0; d < in.schedule.devices; ++d)
        for (int64_t t = 0; t < 2 * plan.period(); ++t) {
          const std::vector<Action>& list = plan.actions(w, d, t);
          const std::vector<KfacWindow> windows = kfac_windows(list);
          size_t q = 0;
          for (size_t i = 0; i < list.size(); ++i) {
            const Action& u = list[i];
            if (!moves(u.kind)) continue;
            ASSERT_LT(q, windows.size()) << where(c, w, t, d, i, u);
            const KfacWindow& got = windows[q++];
            const std::string at = where(c, w, t, d, i, u);
            EXPECT_EQ(got.at, i) << at;
            size_t earliest = 0, latest = list.size();
            for (size_t j = 0; j < i; ++j)
              if (bound(list[j], u)) earliest = j + 1;
            for (size_t v = i; v < list.size(); ++v)  // it and its layer's later units
              if (v == i || same_layer(list[v], u))
                for (size_t j = v + 1; j < list.size(); ++j)
                  if (bound(list[j], list[v])) {
                    latest = std::min(latest, j);
                    break;
                  }
            EXPECT_EQ(got.earliest, earliest) << at;
            EXPECT_EQ(got.latest, latest) << at;
            int before = -1, n = 0;
            for (size_t j = 0; j < i; ++j)
              if (moves(list[j].kind)) {
                if (same_layer(list[j], u)) before = n;
                ++n;
              }
            EXPECT_EQ(got.before, before) << at;
            for (size_t j = got.earliest; j < got.latest; ++j) {
              if (same_layer(list[j], u)) continue;  // its layer's order keeps these
              if (j < i) EXPECT_FALSE(reads(u, list[j], in.recompute)) << at << " reads " << to_token(list[j]);
              if (j > i) EXPECT_FALSE(reads(list[j], u, in.recompute)) << at << " is read by " << to_token(list[j]);
            }
            ++floating;
          }
          EXPECT_EQ(q, windows.size());
        }
    EXPECT_GT(floating, 0) << c.schedule;
  }
}

// The planner's units of each device are the graph's nodes: curvature ready when the pass it
// reads ends, a sync and an inversion after the units they read (a sync also after its stage's
// chained broadcasts), with and without recomputation.
TEST(KfacGraph, PlannerUnitsWaitForWhatTheyRead) {
  for (const Case& c : kCases)
    for (bool recompute : {false, true}) {
      PlanInput in = lowered(c);
      in.recompute = recompute;
      in.precondition = PrecPlacement::gaps;  // pass by pass: one base step
      plan::PlanState state(in);
      for (plan::Pass p : plan::kPasses) {
        if (p == plan::Pass::build_cycle_step0) break;
        plan::run_pass(state, p);
      }
      const Timeline& step = state.base.timeline;
      for (int d = 0; d < in.schedule.devices; ++d) {
        const std::vector<plan::Unit>& units = state.device_units[d].units;
        ASSERT_FALSE(units.empty());
        for (size_t i = 0; i < units.size(); ++i) {
          const Action& u = units[i].action;
          const std::string at = std::string(c.schedule) + (recompute ? " recomputed" : "") + " device " +
                                 std::to_string(d) + " " + to_token(u);
          std::vector<int> want;
          for (size_t j = 0; j < units.size(); ++j)
            if (reads(u, units[j].action, recompute)) want.push_back(static_cast<int>(j));
          std::vector<int> got;
          for (int dep : units[i].deps)
            if (!is_bcast_inv(units[dep].action.kind)) got.push_back(dep);
          EXPECT_EQ(got, want) << at;
          double ready = 0;
          int passes = 0;
          for (const TimedAction& a : step.per_device[d])
            if (reads(u, a.action, recompute)) ready = a.end, ++passes;
          EXPECT_EQ(passes, u.kind == Kind::CURV_A || u.kind == Kind::CURV_B ? 1 : 0) << at;
          EXPECT_EQ(units[i].ready, ready) << at;
        }
      }
    }
}

}  // namespace pf
