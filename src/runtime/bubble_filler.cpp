// The adaptive filler's queue, windows and running profile (bubble_filler.hpp).
#include "runtime/bubble_filler.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <utility>

namespace pf {

namespace {

// The running profile's weight of the newest sample: durations drift over tens of steps, and a
// few samples must carry a changed wait.
constexpr double kNewest = 0.5;
// A unit must fit with the planner's safety margin (pipefisher/controller.hpp: kPlanMargin).
constexpr double kMargin = 0.05;

bool is_curvature(Kind k) { return k == Kind::CURV_A || k == Kind::CURV_B; }
bool same_chunk(const Action& a, const Action& b) { return a.pipeline == b.pipeline && a.stage == b.stage; }

// Does action `a` close the window of floating unit `u` (bubble_filler.hpp's windows)?
bool closes_window(const Action& a, const Action& u) {
  if (a.kind == Kind::OPT) return true;
  if (!same_chunk(a, u)) return false;
  if (a.kind == Kind::SYNC_CURV || a.kind == Kind::PREC || is_bcast_inv(a.kind)) return true;
  return is_curvature(u.kind) && is_pass(a.kind);
}

template <class Map, class Key>
void average_into(Map& m, const Key& k, double sample) {
  auto [it, fresh] = m.try_emplace(k, sample);
  if (!fresh) it->second += kNewest * (sample - it->second);
}

}  // namespace

BubbleFiller::Key BubbleFiller::unit_key(const Action& a) {
  return {static_cast<int>(a.kind), a.pipeline, a.stage, a.layer, a.block};
}
BubbleFiller::Key BubbleFiller::wait_key(const Action& a) {
  return {static_cast<int>(a.kind), a.pipeline, a.stage, a.micro_batch, 0};
}

void BubbleFiller::begin(const std::vector<Action>& list) {
  list_ = &list;
  floating_.assign(list.size(), -1);
  queue_.clear();
  waits_.clear();
  for (size_t i = 0; i < list.size(); ++i) {
    if (is_curvature(list[i].kind) || is_inversion(list[i].kind)) {
      floating_[i] = static_cast<int>(queue_.size());
      queue_.push_back(i);
    }
    if (is_wait(list[i].kind)) waits_.push_back(i);
  }
  ran_.assign(queue_.size(), false);
  open_ = 0;
  set_windows(list);
}

// earliest_: after the last action before the unit that closes its window; deadline_: the first
// after it that does, or an earlier one where a later unit of its layer must run.
void BubbleFiller::set_windows(const std::vector<Action>& list) {
  earliest_.assign(queue_.size(), 0);
  deadline_.assign(queue_.size(), list.size());
  before_.assign(queue_.size(), -1);
  std::map<std::tuple<int, int, int>, int> last;  // (pipeline, stage, layer) -> its latest unit
  for (size_t q = 0; q < queue_.size(); ++q) {
    const size_t p = queue_[q];
    const Action& u = list[p];
    for (size_t j = p; j-- > 0;)
      if (closes_window(list[j], u)) {
        earliest_[q] = j + 1;
        break;
      }
    size_t deadline = p + 1;
    while (deadline < list.size() && !closes_window(list[deadline], u)) ++deadline;
    deadline_[q] = deadline;
    auto [it, fresh] = last.try_emplace({u.pipeline, u.stage, u.layer}, static_cast<int>(q));
    if (!fresh) before_[q] = std::exchange(it->second, static_cast<int>(q));
  }
  for (size_t q = queue_.size(); q-- > 0;)
    if (before_[q] >= 0) deadline_[before_[q]] = std::min(deadline_[before_[q]], deadline_[q]);
}

std::optional<double> BubbleFiller::predicted(const std::map<Key, double>& m, const Key& k) const {
  auto it = m.find(k);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// Deadlines never decrease along a layer's units, so the first due unit's layer has none left
// before it.
std::optional<size_t> BubbleFiller::next_due(size_t i) const {
  for (size_t q = open_; q < queue_.size(); ++q)
    if (!ran_[q] && deadline_[q] <= i) return queue_[q];
  return std::nullopt;
}

bool BubbleFiller::ready(size_t q, size_t i) const {
  return !ran_[q] && earliest_[q] <= i && (before_[q] < 0 || ran_[before_[q]]);
}

bool BubbleFiller::due_at_pass(size_t q) const {
  return deadline_[q] < list_->size() && is_pass((*list_)[deadline_[q]].kind);
}

// A later wait in q's window with more room than `room_ns` (the room left in this one) would
// hide more of it; a wait not seen yet counts as one, as the plan would leave it the chance.
bool BubbleFiller::room_later(size_t q, size_t i, double room_ns) const {
  for (size_t j : waits_) {
    if (j <= i) continue;
    if (j >= deadline_[q]) break;
    const std::optional<double> wait = predicted(wait_ns_, wait_key((*list_)[j]));
    if (!wait || *wait > room_ns) return true;
  }
  return false;
}

std::optional<WaitPick> BubbleFiller::next_for_wait(size_t i, int64_t waited_ns) const {
  const std::optional<double> wait = predicted(wait_ns_, wait_key((*list_)[i]));
  std::optional<WaitPick> best_wait;
  for (size_t q = open_; q < queue_.size(); ++q) {
    if (!ready(q, i)) continue;
    const size_t u = queue_[q];
    const std::optional<double> unit = predicted(unit_ns_, unit_key((*list_)[u]));
    // Nothing seen yet: the plan's own choice, the units it placed before this wait.
    if (!wait || !unit) {
      if (u < i) return WaitPick{u, true};
      continue;
    }
    const double room = *wait - static_cast<double>(waited_ns);
    if (*unit * (1 + kMargin) <= room) return WaitPick{u, true};
    if (!best_wait && due_at_pass(q) && !room_later(q, i, std::max(room, 0.0))) best_wait = WaitPick{u, false};
  }
  return best_wait;
}

void BubbleFiller::ran(size_t u, int64_t ns, bool in_wait) {
  const int q = floating_.at(u);
  PF_CHECK(q >= 0 && !ran_[q], "filler: action {} is no unit left to run", u);
  average_into(unit_ns_, unit_key((*list_)[u]), static_cast<double>(ns));
  ran_[q] = true;
  while (open_ < queue_.size() && ran_[open_]) ++open_;
  ++(in_wait ? stats_.in_wait : stats_.at_deadline);
}

// A unit that overran its wait leaves a lower bound (bubble_filler.hpp): averaged in, it keeps
// the prediction from growing on a fitting unit's overruns and lets it shrink when the waits do.
// A unit started in its best wait overruns by design: its lower bound only ever raises the
// prediction, so that the waits' units that fit keep their room.
void BubbleFiller::waited(size_t i, int64_t ns, bool filled, bool overran) {
  const Key k = wait_key((*list_)[i]);
  const std::optional<double> before = predicted(wait_ns_, k);
  if (!overran || !before || static_cast<double>(ns) > *before) average_into(wait_ns_, k, static_cast<double>(ns));
  stats_.waits_filled += filled;
}

}  // namespace pf
