// What a KfacPlan hands out: the action list of any training step, whole-step schedules, and
// the steady-state timeline of a refresh period for drawing and tracing.
#include "core/error.hpp"
#include "plan/planner.hpp"

#include <algorithm>

namespace pf {

int KfacPlan::period() const {
  return refresh_steps.empty() ? 1 : *std::max_element(refresh_steps.begin(), refresh_steps.end());
}

const std::vector<Action>& KfacPlan::actions(int replica, int device, int64_t t) const {
  PF_CHECK(replica >= 0 && replica < replicas && device >= 0 && device < devices && t >= 0,
           "replica {} device {} step {}", replica, device, t);
  const int R = refresh_steps[device];
  if (t < R) return lists_.first_cycle[replica][device][t];
  return lists_.cycle[replica][device][t % R];
}

std::optional<std::pair<int, int>> KfacPlan::inverter(const Action& a) const {
  for (const StagePlacement& sp : placements())
    if (sp.pipeline == a.pipeline && sp.stage == a.stage) {
      const int m = sp.owner_of(a);
      if (m == kEveryRank) return std::nullopt;
      return sp.members.at(m);
    }
  return std::nullopt;  // one holder: it inverts everything
}

int PrecSplit::member(int device, int replica) const {
  for (size_t m = 0; m < members.size(); ++m)
    if (members[m] == std::pair{device, replica}) return static_cast<int>(m);
  PF_CHECK(false, "device {} replica {} holds no copy of stage {} (pipeline {})", device, replica, stage, pipeline);
  return -1;
}

const PrecSplit* find_prec_split(const std::vector<PrecSplit>& splits, int pipeline, int stage) {
  for (const PrecSplit& ps : splits)
    if (ps.pipeline == pipeline && ps.stage == stage) return &ps;
  return nullptr;
}

const PrecSplit* KfacPlan::prec_split(int pipeline, int stage) const { return find_prec_split(prec_splits, pipeline, stage); }

std::string WeightGradientMoves::line() const {
  return fmt::format("zero-bubble W: {} of {} moved into earlier gaps, step {:.3f} -> {:.3f} without K-FAC work", moved,
                     total, step_before, step_after);
}

double KfacPlan::precondition_share() const {
  return step_time > 0 ? (base_step_time - plain_step_time) / step_time : 0;
}

std::string KfacPlan::precondition_line() const {
  const double busiest = precondition.empty() ? 0 : *std::max_element(precondition.begin(), precondition.end());
  int layers = 0, sent = 0;
  for (const PrecSplit& ps : prec_splits) {
    layers += static_cast<int>(ps.placement.owner.size());
    sent += ps.placement.communicated();
  }
  return fmt::format("precondition {:.3f} per step on the busiest device, lengthening the step by {:.3f} ({:.1f}% of "
                     "it){}", busiest, base_step_time - plain_step_time, 100 * precondition_share(),
                     prec_splits.empty() ? std::string()
                     : fmt::format("; split by layer among each stage's holders: {} of {} layers (over the stage copies) "
                                   "preconditioned by one holder and all-gathered", sent, layers));
}

std::vector<Action> KfacPlan::wrapped(int replica, int device, int k) const {
  return lists_.wrapped_units.at(replica).at(device).at(k);
}

Schedule KfacPlan::schedule_for(int replica, int64_t t) const {
  Schedule s = step_template;
  for (int d = 0; d < devices; ++d) s.per_device[d] = actions(replica, d, t);
  return s;
}

Timeline KfacPlan::period_timeline(int replica, int steps, std::vector<double>* step_starts) const {
  Timeline tl;
  tl.per_device.resize(devices);
  double offset = 0;
  if (step_starts) step_starts->clear();
  for (int t = 0; t < steps; ++t) {
    if (step_starts) step_starts->push_back(offset);
    // Cycle step 0 of replica 0 carries the inline work (the others' timing differs only there).
    const bool first_of_cycle = common_cycle && t % period() == 0;
    const Timeline& step = first_of_cycle ? step0 : base;
    for (int d = 0; d < devices; ++d) {
      for (const TimedAction& a : step.per_device[d]) {
        TimedAction x = a;
        x.start += offset;
        x.end += offset;
        tl.per_device[d].push_back(x);
      }
      // Inline units are already in step0's rows.
      const int k = t % refresh_steps[d];
      for (const PlacedUnit& u : lists_.units)
        if (u.replica == replica && u.device == d && u.step == k && !u.inline_work)
          tl.per_device[d].push_back({u.action, u.start + offset, u.end + offset});
    }
    offset += first_of_cycle ? step0_time : base_step_time;
  }
  tl.step_time = offset;
  for (int d = 0; d < devices; ++d) {
    auto& row = tl.per_device[d];
    std::stable_sort(row.begin(), row.end(), [](const TimedAction& a, const TimedAction& b) { return a.start < b.start; });
    double busy = 0;
    for (const TimedAction& a : row)
      if (is_compute(a.action.kind)) busy += a.end - a.start;
    tl.busy.push_back(busy);
    tl.bubble.push_back(tl.step_time - busy);
    tl.utilization.push_back(tl.step_time > 0 ? busy / tl.step_time : 0);
    tl.peak_in_flight.push_back(base.peak_in_flight.empty() ? 0 : base.peak_in_flight[d]);
  }
  return tl;
}

}  // namespace pf
