#include "schedule/validate.hpp"

#include "schedule/deps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace pf {

namespace {

// Column of each action: its unit step if it ran, else one column after the previous action.
std::vector<std::vector<int>> columns(const Schedule& s) {
  UnitSteps st = unit_steps(s, build_dependencies(s));
  std::vector<std::vector<int>> col(s.devices);
  for (int d = 0; d < s.devices; ++d) {
    int last = -1;
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      int c = st.step[d][i] >= 0 ? st.step[d][i] : std::max(last + 1, st.num_steps);
      col[d].push_back(c);
      last = c;
    }
  }
  return col;
}

[[noreturn]] void refuse(const Schedule& s, Cell at, const std::string& reason,
                         const std::vector<Cell>& blocked = {}) {
  throw ScheduleError(reason, render_grid(s, at, blocked));
}

std::string where(const Schedule& s, Cell c) {
  return fmt::format("{} (device {}, position {})", to_token(s.per_device[c.device][c.index]), c.device, c.index);
}

}  // namespace

std::string render_grid(const Schedule& s, Cell marked, const std::vector<Cell>& blocked) {
  auto col = columns(s);
  int ncols = 0;
  size_t width = 3;
  for (int d = 0; d < s.devices; ++d)
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      ncols = std::max(ncols, col[d][i] + 1);
      width = std::max(width, to_token(s.per_device[d][i]).size() + 2);
    }
  int lo = 0, hi = ncols;
  const int window = 24;
  if (ncols > window) {
    int center = marked.device >= 0 ? col[marked.device][marked.index] : 0;
    lo = std::max(0, center - window / 2);
    hi = std::min(ncols, lo + window);
  }
  std::vector<std::vector<std::string>> cells(s.devices, std::vector<std::string>(hi - lo, "."));
  for (int d = 0; d < s.devices; ++d)
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      int c = col[d][i];
      if (c < lo || c >= hi) continue;
      std::string t = to_token(s.per_device[d][i]);
      bool is_blocked = std::any_of(blocked.begin(), blocked.end(),
                                    [&](Cell b) { return b.device == d && b.index == static_cast<int>(i); });
      if (marked.device == d && marked.index == static_cast<int>(i)) t = "*" + t + "*";
      else if (is_blocked) t = ">" + t + "<";
      cells[d][c - lo] = t;
    }
  std::string out = fmt::format("{:>8}", "step");
  for (int c = lo; c < hi; ++c) out += fmt::format("{:>{}}", c, width);
  if (hi < ncols || lo > 0) out += fmt::format("   (steps {}..{} of {})", lo, hi - 1, ncols);
  out += "\n";
  for (int d = 0; d < s.devices; ++d) {
    out += fmt::format("{:>8}", fmt::format("dev {}", d));
    for (auto& c : cells[d]) out += fmt::format("{:>{}}", c, width);
    out += "\n";
  }
  return out;
}

namespace {

void check_shape(const Schedule& s) {
  if (s.devices < 1 || static_cast<int>(s.per_device.size()) != s.devices)
    throw ScheduleError(fmt::format("devices={} but {} device rows", s.devices, s.per_device.size()), "");
  if (s.stages < 1 || s.pipelines < 1 || s.micro_batches < 1 ||
      static_cast<int>(s.stage_device.size()) != s.pipelines)
    throw ScheduleError("stages, pipelines and micro_batches must be >= 1 with one stage map per pipeline", "");
  for (const auto& m : s.stage_device)
    for (int d : m)
      if (static_cast<int>(m.size()) != s.stages || d < 0 || d >= s.devices)
        throw ScheduleError("stage map must give one device in range per stage", "");
}

// The action at c in range and on its stage's device.
void check_placement(const Schedule& s, Cell c) {
  const Action& a = s.per_device[c.device][c.index];
  if (a.pipeline < 0 || a.pipeline >= s.pipelines)
    refuse(s, c, fmt::format("{}: pipeline {} out of range (pipelines={})", where(s, c), a.pipeline, s.pipelines));
  if (a.stage < 0 || a.stage >= s.stages)
    refuse(s, c, fmt::format("{}: stage {} out of range (stages={})", where(s, c), a.stage, s.stages));
  if (has_micro_batch(a.kind) && (a.micro_batch < 0 || a.micro_batch >= s.micro_batches))
    refuse(s, c, fmt::format("{}: micro-batch {} out of range (micro_batches={})", where(s, c), a.micro_batch, s.micro_batches));
  if (s.device_of(a.pipeline, a.stage) != c.device && !is_p2p(a.kind))
    refuse(s, c, fmt::format("{}: stage {} of pipeline {} lives on device {}", where(s, c), a.stage,
                             a.pipeline, s.device_of(a.pipeline, a.stage)));
}

// The compute actions of one (micro-batch, pipeline, stage), and where the first of them is.
struct ComputeCount {
  int f = 0, b = 0, i = 0, w = 0;
  Cell first;
};

struct ComputeCounts {
  std::map<std::tuple<int, int, int>, ComputeCount> of;  // (micro-batch, pipeline, stage)
  std::map<int, std::map<int, Cell>> pipelines_of;       // micro-batch -> pipeline -> a cell
};

// Every action checked in place, its compute kinds counted (a duplicate refused).
ComputeCounts count_compute(const Schedule& s) {
  ComputeCounts counts;
  for (int d = 0; d < s.devices; ++d)
    for (int i = 0; i < static_cast<int>(s.per_device[d].size()); ++i) {
      const Action& a = s.per_device[d][i];
      Cell c{d, i};
      check_placement(s, c);
      if (a.kind != Kind::F && a.kind != Kind::B && a.kind != Kind::I && a.kind != Kind::W) continue;
      ComputeCount& n = counts.of[{a.micro_batch, a.pipeline, a.stage}];
      int& k = a.kind == Kind::F ? n.f : a.kind == Kind::B ? n.b : a.kind == Kind::I ? n.i : n.w;
      if (++k > 1) refuse(s, c, fmt::format("{}: duplicate {}", where(s, c), kind_name(a.kind)));
      if (n.first.device < 0) n.first = c;
      counts.pipelines_of[a.micro_batch].emplace(a.pipeline, c);
    }
  return counts;
}

// Every micro-batch runs in one pipeline, with F and (B, or I and W) at every stage.
void check_micro_batches(const Schedule& s, const ComputeCounts& counts) {
  for (int m = 0; m < s.micro_batches; ++m) {
    auto it = counts.pipelines_of.find(m);
    if (it == counts.pipelines_of.end())
      throw ScheduleError(fmt::format("micro-batch {} never runs", m), render_grid(s));
    if (it->second.size() > 1)
      refuse(s, std::next(it->second.begin())->second,
             fmt::format("micro-batch {} runs in more than one pipeline", m));
    const int p = it->second.begin()->first;
    for (int st = 0; st < s.stages; ++st) {
      auto c = counts.of.find({m, p, st});
      Cell at = c == counts.of.end() ? it->second.begin()->second : c->second.first;
      std::string what = fmt::format("stage {} micro-batch {}{} (device {})", st, m,
                                     p ? fmt::format(" pipeline {}", p) : "", s.device_of(p, st));
      if (c == counts.of.end() || c->second.f == 0) refuse(s, at, "missing F for " + what);
      const ComputeCount& n = c->second;
      bool full = n.b == 1 && n.i == 0 && n.w == 0, split = n.b == 0 && n.i == 1 && n.w == 1;
      if (!full && !split)
        refuse(s, at, fmt::format("{} needs one B or one I and one W (has B={} I={} W={})", what, n.b, n.i, n.w));
    }
  }
}

// Play with blocking communication: a swapped dependency or a cycle leaves actions unrun.
void check_playable(const Schedule& s) {
  Dependencies deps = build_dependencies(s);
  UnitSteps st = unit_steps(s, deps);
  if (st.complete) return;
  std::vector<Cell> blocked;
  for (int d = 0; d < s.devices; ++d) {
    auto& row = st.step[d];
    auto it = std::find(row.begin(), row.end(), -1);
    if (it != row.end()) blocked.push_back({d, static_cast<int>(it - row.begin())});
  }
  for (Cell b : blocked)  // a dependency later on the same device: an order error, not a cycle
    for (const ActionRef& w : deps.waits_for[b.device][b.index])
      if (w.device == b.device && w.index > b.index)
        refuse(s, b, fmt::format("{} is placed before {} it depends on, on the same device", where(s, b),
                                 to_token(s.per_device[w.device][w.index])), blocked);
  Cell first = blocked.front();
  std::string why;
  for (const ActionRef& w : deps.waits_for[first.device][first.index])
    if (st.step[w.device][w.index] < 0) {
      why = fmt::format(", waiting for {} on device {}", to_token(s.per_device[w.device][w.index]), w.device);
      break;
    }
  refuse(s, first, fmt::format("deadlock with blocking communication at step {}: {} cannot run{}",
                               st.num_steps, where(s, first), why), blocked);
}

}  // namespace

void validate(const Schedule& s) {
  check_shape(s);
  check_micro_batches(s, count_compute(s));
  check_playable(s);
}

}  // namespace pf
