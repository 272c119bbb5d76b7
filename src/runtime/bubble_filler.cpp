// The adaptive filler's queue, windows and running profile (bubble_filler.hpp).
#include "runtime/bubble_filler.hpp"

#include <algorithm>

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
  for (size_t i = 0; i < list.size(); ++i)
    if (is_curvature(list[i].kind) || is_inversion(list[i].kind)) {
      floating_[i] = static_cast<int>(queue_.size());
      queue_.push_back(i);
    }
  done_ = 0;
  set_windows(list);
}

// earliest_: after the last action before the unit that closes its window; due_: the queue
// prefix whose windows have closed at each action (a prefix: the queue runs in order).
void BubbleFiller::set_windows(const std::vector<Action>& list) {
  earliest_.assign(queue_.size(), 0);
  due_.assign(list.size() + 1, 0);
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
    due_[deadline] = std::max(due_[deadline], q + 1);
  }
  for (size_t i = 1; i < due_.size(); ++i) due_[i] = std::max(due_[i], due_[i - 1]);
}

std::optional<double> BubbleFiller::predicted(const std::map<Key, double>& m, const Key& k) const {
  auto it = m.find(k);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::optional<size_t> BubbleFiller::next_for_wait(size_t i, int64_t waited_ns) const {
  if (done_ == queue_.size() || earliest_[done_] > i) return std::nullopt;
  const size_t u = queue_[done_];
  const std::optional<double> wait = predicted(wait_ns_, wait_key((*list_)[i]));
  const std::optional<double> unit = predicted(unit_ns_, unit_key((*list_)[u]));
  // Nothing seen yet: the plan's own choice, the units it placed before this wait.
  if (!wait || !unit) return u < i ? std::optional<size_t>(u) : std::nullopt;
  if (static_cast<double>(waited_ns) + *unit * (1 + kMargin) <= *wait) return u;
  return std::nullopt;
}

void BubbleFiller::ran(int64_t ns, bool in_wait) {
  average_into(unit_ns_, unit_key((*list_)[queue_.at(done_)]), static_cast<double>(ns));
  ++done_;
  ++(in_wait ? stats_.in_wait : stats_.at_deadline);
}

// A unit that overran its wait leaves a lower bound (bubble_filler.hpp): it keeps the prediction
// from growing on its own overruns.
void BubbleFiller::waited(size_t i, int64_t ns, bool filled) {
  average_into(wait_ns_, wait_key((*list_)[i]), static_cast<double>(ns));
  stats_.waits_filled += filled;
}

}  // namespace pf
