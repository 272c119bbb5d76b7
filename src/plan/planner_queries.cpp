// What the runtime asks a KfacPlan besides its lists (planner.hpp): cycle starts, a drain's
// plain list, factor splits, and the inline list of the steps before any plan.
#include "core/error.hpp"
#include "plan/planner.hpp"

#include <algorithm>
#include <set>

namespace pf {

const std::vector<Action>& KfacPlan::cycle_actions(int replica, int device, int k) const {
  return lists_.cycle.at(replica).at(device).at(k);
}

bool KfacPlan::is_cycle_start(int device, int64_t t) const { return t % refresh_steps.at(device) == 0; }

int64_t KfacPlan::next_cycle_start(int device, int64_t t) const {
  const int64_t R = refresh_steps.at(device);
  return (t + R - 1) / R * R;
}

int64_t KfacPlan::all_cycles_start(int64_t t) const {
  int64_t last = t;
  for (int d = 0; d < devices; ++d) last = std::max(last, next_cycle_start(d, t));
  return last;
}

std::vector<Action> KfacPlan::plain_actions(int replica, int device) const {
  std::vector<Action> out;
  for (const Action& a : actions(replica, device, 0))
    if ((!is_kfac(a.kind) && !is_soap(a.kind)) || a.kind == Kind::PREC) out.push_back(a);
  return out;
}

int KfacPlan::split_blocks(int pipeline, int stage, int layer, Kind inv) const {
  int blocks = 1;
  for (const FactorSplit& f : splits())
    if (f.pipeline == pipeline && f.stage == stage && f.layer == layer && f.kind == inv) blocks = f.blocks;
  return blocks;
}

InlineStep profiling_actions(const Schedule& step, int device) {
  const std::vector<Action>& list = step.per_device.at(device);
  std::set<std::pair<int, int>> hosted;  // (stage, pipeline): stage order
  for (const Action& a : list)
    if (is_pass(a.kind))
      hosted.insert({a.stage, a.pipeline});
  const auto first_opt = std::find_if(list.begin(), list.end(), [](const Action& a) { return a.kind == Kind::OPT; });
  const size_t at = static_cast<size_t>(first_opt - list.begin());
  InlineStep out;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == at)
      for (auto [stage, pipeline] : hosted) {
        out.actions.push_back({Kind::PREC, stage, pipeline, -1, -1});
        out.step_index.push_back(-1);
      }
    if (i < list.size()) out.actions.push_back(list[i]), out.step_index.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace pf
