// The adaptive filler's queue, windows and running profile (bubble_filler.hpp).
#include "runtime/bubble_filler.hpp"

#include "core/error.hpp"
#include "sim/fit.hpp"

#include <algorithm>
#include <utility>

namespace pf {

namespace {

// The running profile's weight of the newest sample: durations drift over tens of steps, and a
// few samples must carry a changed wait.
constexpr double kNewest = 0.5;

template <class Map, class Key>
void average_into(Map& m, const Key& k, double sample) {
  auto [it, fresh] = m.try_emplace(k, sample);
  if (!fresh) it->second += kNewest * (sample - it->second);
}

template <class Map, class Key>
std::optional<double> predicted(const Map& m, const Key& k) {
  auto it = m.find(k);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

}  // namespace

BubbleFiller::WaitKey BubbleFiller::wait_key(const Action& a) {
  return {static_cast<int>(a.kind), a.pipeline, a.stage, a.micro_batch};
}

void BubbleFiller::begin(const std::vector<Action>& list) {
  list_ = &list;
  windows_ = kfac_windows(list);
  floating_.assign(list.size(), -1);
  for (size_t q = 0; q < windows_.size(); ++q) floating_[windows_[q].at] = static_cast<int>(q);
  waits_.clear();
  for (size_t i = 0; i < list.size(); ++i)
    if (is_wait(list[i].kind)) waits_.push_back(i);
  ran_.assign(windows_.size(), false);
  open_ = 0;
}

// Deadlines never decrease along a layer's units, so the first due unit's layer has none left
// before it.
std::optional<size_t> BubbleFiller::next_due(size_t i) const {
  for (size_t q = open_; q < windows_.size(); ++q)
    if (!ran_[q] && windows_[q].latest <= i) return windows_[q].at;
  return std::nullopt;
}

bool BubbleFiller::ready(size_t q, size_t i) const {
  const KfacWindow& w = windows_[q];
  return !ran_[q] && w.earliest <= i && (w.before < 0 || ran_[w.before]);
}

bool BubbleFiller::due_at_pass(size_t q) const {
  const size_t latest = windows_[q].latest;
  return latest < list_->size() && is_pass((*list_)[latest].kind);
}

// A later wait in q's window with more room than `room_ns` (the room left in this one) would
// hide more of it; a wait not seen yet counts as one, as the plan would leave it the chance.
bool BubbleFiller::room_later(size_t q, size_t i, double room_ns) const {
  for (size_t j : waits_) {
    if (j <= i) continue;
    if (j >= windows_[q].latest) break;
    const std::optional<double> wait = predicted(wait_ns_, wait_key((*list_)[j]));
    if (!wait || *wait > room_ns) return true;
  }
  return false;
}

std::optional<WaitPick> BubbleFiller::next_for_wait(size_t i, int64_t waited_ns) const {
  const std::optional<double> wait = predicted(wait_ns_, wait_key((*list_)[i]));
  std::optional<WaitPick> best_wait;
  for (size_t q = open_; q < windows_.size(); ++q) {
    if (!ready(q, i)) continue;
    const size_t u = windows_[q].at;
    const std::optional<double> unit = predicted(unit_ns_, cost_key((*list_)[u]));
    // Nothing seen yet: the plan's own choice, the units it placed before this wait.
    if (!wait || !unit) {
      if (u < i) return WaitPick{u, true};
      continue;
    }
    const double room = *wait - static_cast<double>(waited_ns);
    if (Fit{}.holds(0, *unit, room)) return WaitPick{u, true};
    if (!best_wait && due_at_pass(q) && !room_later(q, i, std::max(room, 0.0))) best_wait = WaitPick{u, false};
  }
  return best_wait;
}

void BubbleFiller::ran(size_t u, int64_t ns, bool in_wait) {
  const int q = floating_.at(u);
  PF_CHECK(q >= 0 && !ran_[q], "filler: action {} is no unit left to run", u);
  average_into(unit_ns_, cost_key((*list_)[u]), static_cast<double>(ns));
  ran_[q] = true;
  while (open_ < windows_.size() && ran_[open_]) ++open_;
  ++(in_wait ? stats_.in_wait : stats_.at_deadline);
}

// A unit that overran its wait leaves a lower bound (bubble_filler.hpp): averaged in, it keeps
// the prediction from growing on a fitting unit's overruns and lets it shrink when the waits do.
// A unit started in its best wait overruns by design: its lower bound only ever raises the
// prediction, so that the waits' units that fit keep their room.
void BubbleFiller::waited(size_t i, int64_t ns, bool filled, bool overran) {
  const WaitKey k = wait_key((*list_)[i]);
  const std::optional<double> before = predicted(wait_ns_, k);
  if (!overran || !before || static_cast<double>(ns) > *before) average_into(wait_ns_, k, static_cast<double>(ns));
  stats_.waits_filled += filled;
}

}  // namespace pf
