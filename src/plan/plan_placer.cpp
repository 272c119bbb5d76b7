// The Placer (plan_state.hpp): a device's gaps over consecutive cycle steps, each with its cursor,
// and the greedy fit of one unit into them (pack_by_strategy's strategies all place through it).
#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <vector>

namespace pf::plan {

void Placer::add_step() {
  const int k = steps++;
  if (period > 0 && k >= period) {
    for (size_t i = 0, n = gaps.size(); i < n; ++i)
      if (gaps[i].step == k - period) {
        const double shift = offset(k) - offset(k - period);
        const Gap& g = gaps[i].gap;
        gaps.push_back({{g.start + shift, g.end + shift, g.insert_at, g.leading}, k, gaps[i].cursor_gap, 0});
      }
    return;
  }
  for (const Gap& g : (k == 0 ? step0 : base).gaps(device)) {
    if (k == 0 && g.leading && period == 0) continue;  // only the previous cycle's work can run there
    const int self = static_cast<int>(gaps.size());
    gaps.push_back({{g.start + offset(k), g.end + offset(k), g.insert_at, g.leading}, k, self, g.start});
  }
}

void Placer::keep_room(int n_steps, double size, int count, int per_gap) {
  while (steps < n_steps && steps <= max_step) add_step();
  std::vector<int> order;  // physical gaps of those steps, the latest first
  for (int i = static_cast<int>(gaps.size()); i-- > 0;)
    if (gaps[i].cursor_gap == i && gaps[i].step < n_steps) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gaps[a].step > gaps[b].step; });
  for (int round = 0, kept_any = 1; round < per_gap && count > 0 && kept_any; ++round) {
    kept_any = 0;
    for (int i : order)
      if (count > 0 && gaps[i].gap.end - gaps[i].gap.start + kEps >= gaps[i].kept + size)
        gaps[i].kept += size, --count, kept_any = 1;
  }
}

std::pair<int, double> Placer::place(double ready, double dur, bool best_fit, bool keep) {
  int found = -1;
  for (size_t i = 0;; ++i) {
    while (i >= gaps.size() && steps <= max_step) {
      PF_CHECK(steps < 10000, "placement does not terminate (unit of {})", dur);
      add_step();
    }
    if (i >= gaps.size()) {
      if (found < 0) return {-1, 0.0};
      break;
    }
    const StepGap& g = gaps[i];
    if (found >= 0 && g.step != gaps[found].step) break;
    if (g.step > max_step) {
      if (found < 0) return {-1, 0.0};
      break;
    }
    if (g.gap.end <= ready) continue;
    double s0 = std::max(cursor(g), ready);
    if (!fit.holds(s0, dur, g.gap.end - (keep ? gaps[g.cursor_gap].kept : 0.0))) continue;
    if (found < 0 || g.gap.end - s0 < gaps[found].gap.end - std::max(cursor(gaps[found]), ready))
      found = static_cast<int>(i);
    if (!best_fit) break;
  }
  const StepGap& g = gaps[found];
  const double s0 = std::max(cursor(g), ready);
  gaps[g.cursor_gap].cursor = s0 + dur - offset(g.step);
  return {found, s0};
}

}  // namespace pf::plan
