#include "sim/step_account.hpp"

#include "core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

namespace pf {

namespace {

constexpr double kEps = 1e-9;  // ms: stamps this close are the same time

bool is_receive(Kind k) { return k == Kind::RECV_F || k == Kind::RECV_B; }

const TracedAction& at(const TracedStep& s, int rank, int index) { return s.per_rank[rank][index]; }

// The SEND whose message a receive of `rank` waits for, in the same replica: {rank, index} or {-1, -1}.
std::pair<int, int> sender_of(const TracedStep& s, int devices, int rank, const Action& recv) {
  const Kind send = recv.kind == Kind::RECV_F ? Kind::SEND_F : Kind::SEND_B;
  const int stage = recv.kind == Kind::RECV_F ? recv.stage - 1 : recv.stage + 1;
  const int first = rank / devices * devices, ranks = static_cast<int>(s.per_rank.size());
  for (int r = first; r < std::min(first + devices, ranks); ++r)
    for (size_t i = 0; i < s.per_rank[r].size(); ++i) {
      const Action& a = s.per_rank[r][i].action;
      if (a.kind == send && a.stage == stage && a.pipeline == recv.pipeline && a.micro_batch == recv.micro_batch)
        return {r, static_cast<int>(i)};
    }
  return {-1, -1};
}

int first_opt(const std::vector<TracedAction>& row) {
  for (size_t i = 0; i < row.size(); ++i)
    if (row[i].action.kind == Kind::OPT) return static_cast<int>(i);
  return -1;
}

// The latest arrival of a rank other than `except` at its first OPT (every rank finishes the
// gradients there together): the end of the action before it; time -1 when there is none.
BubbleEnd last_arrival(const TracedStep& s, int except) {
  BubbleEnd last{.time = -1, .rank = -1, .index = -1};
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
    const int f = first_opt(s.per_rank[r]);
    if (r == except || f < 0) continue;
    const double t = f > 0 ? at(s, r, f - 1).end : 0;
    if (t > last.time) last = {t, r, f - 1};
  }
  return last;
}

// The last action of `row` that starts before t, or -1.
int last_before(const std::vector<TracedAction>& row, double t) {
  for (int i = static_cast<int>(row.size()) - 1; i >= 0; --i)
    if (row[i].start < t - kEps) return i;
  return -1;
}

// Where the walk goes on from: a rank and a time.
struct Cursor {
  int rank = 0;
  double t = 0;
};

// A unit on the path: only its stretch after its bubble's end; before, what ended the bubble.
Cursor back_over_unit(const TracedStep& s, int devices, int rank, int i, double t, std::vector<PathSegment>& path) {
  const TracedAction& a = at(s, rank, i);
  const BubbleEnd b = bubble_end(s, devices, rank, i);
  const bool elsewhere = b.rank != rank && b.time > a.start + kEps;
  const double cut = elsewhere ? std::clamp(b.time, a.start, t) : a.start;
  if (cut < t) path.push_back({rank, i, cut, t, part_of(a.action.kind)});
  return {elsewhere ? b.rank : rank, cut};
}

// A rank's first OPT waits for the last rank to arrive (the wait is drawn before its start).
Cursor back_over_first_opt(const TracedStep& s, int rank, int i, double t, std::vector<PathSegment>& path) {
  const TracedAction& a = at(s, rank, i);
  path.push_back({rank, i, a.start, t, Part::optimizer});
  const double own = std::min(a.start, i > 0 ? at(s, rank, i - 1).end : 0.0);
  const BubbleEnd last = last_arrival(s, rank);
  if (last.rank >= 0 && last.time > own + kEps) {
    const double from = std::min(last.time, a.start);
    if (from < a.start) path.push_back({rank, i, from, a.start, Part::optimizer});
    return {last.rank, from};
  }
  if (own < a.start) path.push_back({rank, i, own, a.start, Part::optimizer});
  return {rank, own};
}

// One action on the path, ending at t: its stretch, and what bound its start.
Cursor back_over(const TracedStep& s, int devices, int rank, int i, double t, std::vector<PathSegment>& path) {
  const TracedAction& a = at(s, rank, i);
  const Kind k = a.action.kind;
  if (is_bubble_unit(k)) return back_over_unit(s, devices, rank, i, t, path);
  if (k == Kind::OPT && i == first_opt(s.per_rank[rank])) return back_over_first_opt(s, rank, i, t, path);
  if (is_receive(k)) {
    const auto [r, j] = sender_of(s, devices, rank, a.action);
    if (r >= 0 && at(s, r, j).end > a.start + kEps) {  // it waited for its message
      const double m = std::min(at(s, r, j).end, t);
      path.push_back({rank, i, m, t, Part::communication});
      return {r, m};
    }
  }
  path.push_back({rank, i, a.start, t, part_of(k)});
  return {rank, a.start};
}

// A pass's stretch gives its taps their share of it (the taps' fraction of the whole pass).
std::array<double, kNumParts> part_sums(const std::vector<PathSegment>& path, const TracedStep& s) {
  std::array<double, kNumParts> sums{};
  for (const PathSegment& p : path) {
    double taps = 0;
    if (p.part == Part::forward || p.part == Part::backward) {
      const TracedAction& a = at(s, p.rank, p.index);
      if (a.taps > 0 && a.duration() > 0) taps = std::min(1.0, a.taps / a.duration()) * (p.end - p.start);
    }
    sums[static_cast<int>(Part::taps)] += taps;
    sums[static_cast<int>(p.part)] += p.end - p.start - taps;
  }
  return sums;
}

// The first action after `index` that is neither a unit nor a receive: what an overrun delays.
int delayed_by(const std::vector<TracedAction>& row, int index) {
  for (int n = index + 1; n < static_cast<int>(row.size()); ++n)
    if (!is_bubble_unit(row[n].action.kind) && !is_receive(row[n].action.kind)) return n;
  return -1;
}

std::vector<UnitAccount> unit_accounts(const TracedStep& s, int devices) {
  std::vector<UnitAccount> out;
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r)
    for (int i = 0; i < static_cast<int>(s.per_rank[r].size()); ++i) {
      const TracedAction& a = at(s, r, i);
      if (!is_bubble_unit(a.action.kind)) continue;
      UnitAccount u{.rank = r, .index = i, .measured = a.duration(), .end = a.end, .bubble = bubble_end(s, devices, r, i)};
      if (a.planned()) u.planned = a.planned_end - a.planned_start;
      u.overrun = std::max(0.0, a.end - u.bubble.time);
      if (u.overrun > 0) u.delayed = delayed_by(s.per_rank[r], i);
      out.push_back(u);
    }
  return out;
}

void pass_sums(const std::vector<TracedAction>& row, double& forward, double& backward, double& taps) {
  for (const TracedAction& a : row) {
    if (!is_pass(a.action.kind)) continue;
    (a.action.kind == Kind::F ? forward : backward) += a.without_taps();
    taps += a.taps;
  }
}

// Time within [start, end] when some other rank ran a bubble unit (units of one rank never overlap).
double beside_units(const TracedStep& s, int rank, double start, double end) {
  double t = 0;
  for (size_t r = 0; r < s.per_rank.size(); ++r) {
    if (static_cast<int>(r) == rank) continue;
    for (const TracedAction& u : s.per_rank[r])
      if (is_bubble_unit(u.action.kind)) t += std::max(0.0, std::min(end, u.end) - std::max(start, u.start));
  }
  return t;
}

// The same action's duration without its taps in `row`; NaN when it has none.
double duration_of(const std::vector<TracedAction>& row, const Action& a) {
  for (const TracedAction& b : row)
    if (b.action == a) return b.without_taps();
  return std::numeric_limits<double>::quiet_NaN();
}

std::array<PassGroup, kNumPassSettings> passes_by_setting(const TracedStep& s, const TracedStep& base, int rank) {
  std::array<PassGroup, kNumPassSettings> groups{};
  const std::vector<TracedAction>& row = s.per_rank[rank];
  for (size_t i = 0; i < row.size(); ++i) {
    if (!is_pass(row[i].action.kind)) continue;
    const double base_ms = duration_of(base.per_rank[rank], row[i].action);
    if (!std::isfinite(base_ms)) continue;
    PassGroup& g = groups[static_cast<int>(pass_setting(s, rank, static_cast<int>(i)))];
    ++g.count;
    g.ms += row[i].without_taps();
    g.base_ms += base_ms;
  }
  return groups;
}

}  // namespace

std::string_view pass_setting_name(PassSetting p) {
  static constexpr std::string_view names[kNumPassSettings] = {"after a unit", "beside a unit", "alone"};
  return names[static_cast<int>(p)];
}

PassSetting pass_setting(const TracedStep& s, int rank, int index) {
  const std::vector<TracedAction>& row = s.per_rank[rank];
  for (int i = index - 1; i >= 0; --i) {
    const Part p = part_of(row[i].action.kind);
    if (p == Part::communication) continue;
    if (is_bubble_unit(row[i].action.kind)) return PassSetting::after_unit;
    break;
  }
  const TracedAction& a = row[index];
  return 2 * beside_units(s, rank, a.start, a.end) >= a.duration() ? PassSetting::beside_unit : PassSetting::alone;
}

std::string_view part_name(Part p) {
  static constexpr std::string_view names[kNumParts] = {
      "forward passes",    "backward passes",   "K-FAC taps in passes",   "optimizer",
      "send/receive",      "precondition",      "curvature overrun",      "inversion overrun",
      "sync/broadcast overrun", "other (between actions)"};
  return names[static_cast<int>(p)];
}

Part part_of(Kind k) {
  switch (k) {
    case Kind::F: return Part::forward;
    case Kind::B: case Kind::I: case Kind::W: return Part::backward;
    case Kind::OPT: return Part::optimizer;
    case Kind::PREC: return Part::precondition;
    case Kind::CURV_A: case Kind::CURV_B: return Part::curvature;
    case Kind::INV_A: case Kind::INV_B: return Part::inversion;
    case Kind::EIG_L: case Kind::EIG_R: return Part::inversion;  // SOAP's factor refresh
    case Kind::STAT: return Part::curvature;                     // SOAP's statistics: its curvature
    case Kind::SYNC_CURV: case Kind::BCAST_INV_A: case Kind::BCAST_INV_B: return Part::kfac_collective;
    default: return Part::communication;  // SEND, RECV, ALLREDUCE
  }
}

bool is_bubble_unit(Kind k) { return (is_kfac(k) && k != Kind::PREC) || is_soap(k); }

BubbleEnd bubble_end(const TracedStep& s, int devices, int rank, int index) {
  const std::vector<TracedAction>& row = s.per_rank[rank];
  int p = index - 1;
  while (p >= 0 && is_bubble_unit(row[p].action.kind)) --p;
  const BubbleEnd own{.time = p >= 0 ? row[p].end : 0.0, .rank = rank, .index = p};
  int n = index + 1;
  while (n < static_cast<int>(row.size()) && is_bubble_unit(row[n].action.kind)) ++n;
  if (n >= static_cast<int>(row.size())) return own;
  BubbleEnd other{.time = -1, .rank = -1, .index = -1};
  if (is_receive(row[n].action.kind)) {
    const auto [r, j] = sender_of(s, devices, rank, row[n].action);
    if (r >= 0) other = {at(s, r, j).end, r, j};
  } else if (n == first_opt(row)) {
    other = last_arrival(s, rank);
  }
  return other.time > own.time ? other : own;
}

std::vector<PathSegment> critical_path(const TracedStep& s, int devices) {
  std::vector<PathSegment> path;
  Cursor c{0, s.step_time};  // from the rank whose last action ends the step
  size_t actions = 0;
  double last_end = -1;
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
    actions += s.per_rank[r].size();
    if (!s.per_rank[r].empty() && s.per_rank[r].back().end > last_end) c.rank = r, last_end = s.per_rank[r].back().end;
  }
  // Each turn moves back in time or to an earlier action; the bound only guards against a cycle
  // of zero-length jumps between ranks (stamps on clocks a few microseconds apart).
  for (size_t guard = 4 * actions + 16; c.t > kEps && guard > 0; --guard) {
    const std::vector<TracedAction>& row = s.per_rank[c.rank];
    const int i = last_before(row, c.t);
    if (i < 0) break;
    if (row[i].end < c.t - kEps) {  // the rank ran nothing here
      path.push_back({c.rank, -1, row[i].end, c.t, Part::other});
      c.t = row[i].end;
    }
    c = back_over(s, devices, c.rank, i, c.t, path);
  }
  if (c.t > 0) path.push_back({c.rank, -1, 0, c.t, Part::other});
  std::reverse(path.begin(), path.end());
  return path;
}

StepAccount account_step(const TracedStep& s, int devices, const TracedStep& base, int base_devices) {
  StepAccount a;
  a.step = s.step;
  a.base_step = base.step;
  a.step_time = s.step_time;
  a.base_step_time = base.step_time;
  a.path = critical_path(s, devices);
  a.base_path = critical_path(base, base_devices);
  a.parts = part_sums(a.path, s);
  a.base_parts = part_sums(a.base_path, base);
  a.units = unit_accounts(s, devices);
  for (size_t r = 0; r < std::min(s.per_rank.size(), base.per_rank.size()); ++r) {
    RankPasses p{.rank = static_cast<int>(r)};
    pass_sums(s.per_rank[r], p.forward, p.backward, p.taps);
    pass_sums(base.per_rank[r], p.base_forward, p.base_backward, p.base_taps);
    p.by_setting = passes_by_setting(s, base, static_cast<int>(r));
    a.passes.push_back(p);
  }
  return a;
}

std::vector<StepAccount> account_run(const TracedRun& run, const TracedRun& base, const std::string& flag) {
  const size_t ranks = run.steps.front().per_rank.size(), base_ranks = base.steps.front().per_rank.size();
  if (ranks != base_ranks)
    usage_error(flag, "'{}' has {} ranks, the baseline '{}' {}: compare runs of one layout", run.dir, ranks, base.dir,
                base_ranks);
  std::map<int, const TracedStep*> by_number;
  for (const TracedStep& b : base.steps) by_number[b.step] = &b;
  std::vector<StepAccount> out;
  std::vector<int> mine, theirs;
  for (const TracedStep& s : run.steps) {
    mine.push_back(s.step);
    if (auto it = by_number.find(s.step); it != by_number.end())
      out.push_back(account_step(s, run.devices, *it->second, base.devices));
  }
  for (const TracedStep& b : base.steps) theirs.push_back(b.step);
  if (out.empty())
    usage_error(flag, "no step was profiled in both runs ('{}': steps {}; '{}': steps {}): give both runs the same "
                "--profile-steps", run.dir, fmt::join(mine, " "), base.dir, fmt::join(theirs, " "));
  return out;
}

}  // namespace pf
