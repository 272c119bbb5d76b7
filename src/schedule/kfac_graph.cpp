// The K-FAC graph's rules (kfac_graph.hpp): what each unit reads, the index that resolves it, the
// units a device's step emits, and the windows of a placed list.
#include "schedule/kfac_graph.hpp"

#include <algorithm>
#include <iterator>

namespace pf {

namespace {

// The rows of the table in kfac_graph.hpp.
constexpr KfacRead kForward{{Kind::F, Kind::F}, 1, Match::micro_batch, false};
constexpr KfacRead kInputGradient{{Kind::B, Kind::I}, 2, Match::micro_batch, false};  // B, else I
constexpr KfacRead kCurvature{{Kind::CURV_A, Kind::CURV_B}, 2, Match::chunk, true};
constexpr KfacRead kFactorA{{Kind::CURV_A, Kind::CURV_A}, 1, Match::layer, true};
constexpr KfacRead kFactorB{{Kind::CURV_B, Kind::CURV_B}, 1, Match::layer, true};
constexpr KfacRead kSync{{Kind::SYNC_CURV, Kind::SYNC_CURV}, 1, Match::chunk, false};
constexpr KfacRead kAllreduce{{Kind::ALLREDUCE, Kind::ALLREDUCE}, 1, Match::chunk, false};

constexpr KfacRead kCurvA[] = {kForward};
constexpr KfacRead kCurvARecomputed[] = {kInputGradient};
constexpr KfacRead kCurvB[] = {kInputGradient};
constexpr KfacRead kSyncCurv[] = {kCurvature};
constexpr KfacRead kInvA[] = {kFactorA, kSync};
constexpr KfacRead kInvB[] = {kFactorB, kSync};
constexpr KfacRead kPrec[] = {kFinalBackwards, kAllreduce};

// Packs (kind, pipeline, stage, micro-batch, layer) into one 64-bit key.
uint64_t key(Kind k, int p, int s, int m, int l) {
  uint64_t x = static_cast<uint64_t>(k);
  x = x * 8 + static_cast<uint64_t>(p & 7);
  x = (x << 16) | static_cast<uint64_t>(s & 0xffff);
  x = (x << 20) | static_cast<uint64_t>((m + 1) & 0xfffff);
  x = (x << 16) | static_cast<uint64_t>((l + 1) & 0xffff);
  return x;
}

bool same_chunk(const Action& a, const Action& b) { return a.pipeline == b.pipeline && a.stage == b.stage; }

}  // namespace

std::span<const KfacRead> kfac_reads(Kind unit, const KfacRules& rules) {
  switch (unit) {
    case Kind::CURV_A: return rules.recompute ? std::span<const KfacRead>(kCurvARecomputed) : kCurvA;
    case Kind::CURV_B: return kCurvB;
    case Kind::SYNC_CURV: return kSyncCurv;
    case Kind::INV_A: return kInvA;
    case Kind::INV_B: return kInvB;
    case Kind::PREC: return kPrec;
    default: return {};  // BCAST_INV_*: the previous cycle's inverse; the pipeline's kinds: deps.cpp
  }
}

void KfacIndex::reserve(size_t actions) { at_.reserve(actions * 2); }

int KfacIndex::add(const Action& a) {
  const int n = count_++;
  at_.emplace(key(a.kind, a.pipeline, a.stage, a.micro_batch, a.layer), n);
  // Only the kinds some row reads every one of.
  if (kCurvature.reads(a.kind) || kFinalBackwards.reads(a.kind)) {
    of_[{static_cast<int>(a.kind), a.pipeline, a.stage, -1}].push_back(n);
    if (a.layer >= 0) of_[{static_cast<int>(a.kind), a.pipeline, a.stage, a.layer}].push_back(n);
  }
  return n;
}

int KfacIndex::find(Kind k, int pipeline, int stage, int micro_batch, int layer) const {
  auto it = at_.find(key(k, pipeline, stage, micro_batch, layer));
  return it == at_.end() ? -1 : it->second;
}

void KfacIndex::every(const KfacRead& row, int pipeline, int stage, int layer, std::vector<int>& out) const {
  const std::vector<int>* found[2] = {};
  int n = 0;
  for (int k = 0; k < row.count; ++k)
    if (auto it = of_.find({static_cast<int>(row.kinds[k]), pipeline, stage, layer}); it != of_.end()) found[n++] = &it->second;
  if (n == 1) out.insert(out.end(), found[0]->begin(), found[0]->end());
  if (n == 2) std::merge(found[0]->begin(), found[0]->end(), found[1]->begin(), found[1]->end(), std::back_inserter(out));
}

void KfacIndex::reads(const Action& unit, const KfacRules& rules, std::vector<int>& out) const {
  for (const KfacRead& row : kfac_reads(unit.kind, rules)) {
    if (row.every) {
      every(row, unit.pipeline, unit.stage, row.match == Match::layer ? unit.layer : -1, out);
      continue;
    }
    const int m = row.match == Match::micro_batch ? unit.micro_batch : -1;
    for (int k = 0; k < row.count; ++k)
      if (const int n = find(row.kinds[k], unit.pipeline, unit.stage, m); n >= 0) {
        out.push_back(n);
        break;
      }
  }
}

KfacCostKey cost_key(const Action& unit) { return {unit.kind, unit.pipeline, unit.stage, unit.layer, unit.block}; }

namespace {

// Emits `a` into the graph: its reads among the nodes so far, then it.
void add_node(KfacGraph& g, KfacIndex& index, const KfacRules& rules, const Action& a, int pass) {
  KfacNode n{a, pass, {}, cost_key(a)};
  index.reads(a, rules, n.reads);
  index.add(a);
  g.nodes.push_back(std::move(n));
}

}  // namespace

KfacGraph kfac_graph(const std::vector<Action>& step, const KfacGraphInput& in) {
  KfacGraph g;
  for (const Action& a : step)
    if (a.kind == Kind::F && std::find(g.chunks.begin(), g.chunks.end(), std::pair{a.pipeline, a.stage}) == g.chunks.end())
      g.chunks.push_back({a.pipeline, a.stage});
  KfacIndex index;
  if (in.work == BubbleWork::soap) {
    for (int side = 0; side < 2; ++side)
      for (auto [p, s] : g.chunks)
        for (int l = 0; l < in.layers.at(s); ++l) add_node(g, index, in.rules, Action{eigenbasis_kind(side), s, p, -1, l}, -1);
    return g;
  }
  for (int side = 0; side < 2; ++side) {  // each pass a curvature unit reads, in list order
    const Kind kind = curvature_kind(side);
    const KfacRead& pass = kfac_reads(kind, in.rules).front();
    for (size_t i = 0; i < step.size(); ++i) {
      const Action& a = step[i];
      if (!pass.reads(a.kind)) continue;
      for (int l = 0; l < in.layers.at(a.stage); ++l)
        add_node(g, index, in.rules, Action{kind, a.stage, a.pipeline, a.micro_batch, l}, static_cast<int>(i));
    }
  }
  if (in.sync)
    for (auto [p, s] : g.chunks) add_node(g, index, in.rules, Action{Kind::SYNC_CURV, s, p, -1, -1}, -1);
  for (int side = 0; side < 2; ++side)
    for (auto [p, s] : g.chunks)
      for (int l = 0; l < in.layers.at(s); ++l) add_node(g, index, in.rules, Action{inversion_kind(side), s, p, -1, l}, -1);
  return g;
}

bool floats(Kind k) { return is_curvature(k) || is_inversion(k); }

bool bounds_window(const Action& a, const Action& unit) {
  if (a.kind == Kind::OPT) return true;
  if (!same_chunk(a, unit)) return false;
  if (a.kind == Kind::SYNC_CURV || a.kind == Kind::PREC || is_bcast_inv(a.kind)) return true;
  return is_curvature(unit.kind) && is_pass(a.kind);
}

// Each window from the bounds around its unit; then, back to front, no later than the next
// window of its layer.
std::vector<KfacWindow> kfac_windows(const std::vector<Action>& list) {
  std::vector<KfacWindow> windows;
  std::map<std::tuple<int, int, int>, int> last;  // (pipeline, stage, layer) -> its latest window
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& u = list[i];
    if (!floats(u.kind)) continue;
    KfacWindow w;
    w.at = i;
    for (size_t j = i; j-- > 0;)
      if (bounds_window(list[j], u)) {
        w.earliest = j + 1;
        break;
      }
    w.latest = i + 1;
    while (w.latest < list.size() && !bounds_window(list[w.latest], u)) ++w.latest;
    auto [it, fresh] = last.try_emplace({u.pipeline, u.stage, u.layer}, static_cast<int>(windows.size()));
    if (!fresh) w.before = std::exchange(it->second, static_cast<int>(windows.size()));
    windows.push_back(w);
  }
  for (size_t q = windows.size(); q-- > 0;)
    if (const int b = windows[q].before; b >= 0) windows[b].latest = std::min(windows[b].latest, windows[q].latest);
  return windows;
}

}  // namespace pf
