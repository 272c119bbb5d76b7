#include "schedule/deps.hpp"

#include <map>
#include <tuple>
#include <unordered_map>

namespace pf {

namespace {

// Packs (kind, pipeline, stage, micro-batch, layer) into one 64-bit key.
uint64_t key(Kind k, int p, int s, int m, int l) {
  uint64_t x = static_cast<uint64_t>(k);
  x = x * 8 + static_cast<uint64_t>(p & 7);
  x = (x << 16) | static_cast<uint64_t>(s & 0xffff);
  x = (x << 20) | static_cast<uint64_t>((m + 1) & 0xfffff);
  x = (x << 16) | static_cast<uint64_t>((l + 1) & 0xffff);
  return x;
}
uint64_t key(const Action& a) { return key(a.kind, a.pipeline, a.stage, a.micro_batch, a.layer); }

struct Index {
  std::unordered_map<uint64_t, ActionRef> at;
  // Per (pipeline, stage): final backwards (B or W), and curvature actions by (kind, layer).
  std::map<std::pair<int, int>, std::vector<ActionRef>> final_backward;
  std::map<std::tuple<int, int, int>, std::vector<ActionRef>> curvature;  // (p, s, kind*65536+layer)
  std::map<std::pair<int, int>, std::vector<ActionRef>> any_curvature;

  const ActionRef* find(Kind k, int p, int s, int m, int l = -1) const {
    auto it = at.find(key(k, p, s, m, l));
    return it == at.end() ? nullptr : &it->second;
  }
};

Index build_index(const Schedule& s) {
  Index ix;
  ix.at.reserve(s.num_actions() * 2);
  for (int d = 0; d < s.devices; ++d)
    for (int i = 0; i < static_cast<int>(s.per_device[d].size()); ++i) {
      const Action& a = s.per_device[d][i];
      ix.at.emplace(key(a), ActionRef{d, i});  // a duplicate keeps the first; the validator reports it
      if (a.kind == Kind::B || a.kind == Kind::W) ix.final_backward[{a.pipeline, a.stage}].push_back({d, i});
      if (a.kind == Kind::CURV_A || a.kind == Kind::CURV_B) {
        ix.curvature[{a.pipeline, a.stage, static_cast<int>(a.kind) * 65536 + a.layer}].push_back({d, i});
        ix.any_curvature[{a.pipeline, a.stage}].push_back({d, i});
      }
    }
  return ix;
}

// What action `a` waits for (the table in deps.hpp), appended to w.
void add_waits(const Schedule& s, const Index& ix, const Action& a, std::vector<ActionRef>& w) {
  auto need = [&](const ActionRef* r) {
    if (r) w.push_back(*r);
  };
  auto need_all = [&](const auto& map, const auto& k) {
    auto it = map.find(k);
    if (it != map.end()) w.insert(w.end(), it->second.begin(), it->second.end());
  };
  auto backward = [&](int st) {  // B or I of (pipeline, st, mb)
    const ActionRef* r = ix.find(Kind::B, a.pipeline, st, a.micro_batch);
    return r ? r : ix.find(Kind::I, a.pipeline, st, a.micro_batch);
  };
  const int p = a.pipeline, st = a.stage, m = a.micro_batch;
  switch (a.kind) {
    case Kind::F:
      if (const ActionRef* r = ix.find(Kind::RECV_F, p, st, m)) need(r);
      else if (st > 0) need(ix.find(Kind::F, p, st - 1, m));
      break;
    case Kind::B:
    case Kind::I:
      need(ix.find(Kind::F, p, st, m));
      if (const ActionRef* r = ix.find(Kind::RECV_B, p, st, m)) need(r);
      else if (st + 1 < s.stages) need(backward(st + 1));
      break;
    case Kind::W: need(ix.find(Kind::I, p, st, m)); break;
    case Kind::SEND_F: need(ix.find(Kind::F, p, st, m)); break;
    case Kind::RECV_F: need(ix.find(Kind::SEND_F, p, st - 1, m)); break;
    case Kind::SEND_B: need(backward(st)); break;
    case Kind::RECV_B: need(ix.find(Kind::SEND_B, p, st + 1, m)); break;
    case Kind::CURV_A: need(ix.find(Kind::F, p, st, m)); break;
    case Kind::CURV_B: need(backward(st)); break;
    case Kind::SYNC_CURV: need_all(ix.any_curvature, std::pair{p, st}); break;
    case Kind::INV_A:
    case Kind::INV_B: {
      Kind c = curvature_kind(side_index(a.kind));
      need_all(ix.curvature, std::tuple{p, st, static_cast<int>(c) * 65536 + a.layer});
      need(ix.find(Kind::SYNC_CURV, p, st, -1));
      break;
    }
    case Kind::ALLREDUCE: need_all(ix.final_backward, std::pair{p, st}); break;
    case Kind::PREC:
      need_all(ix.final_backward, std::pair{p, st});
      need(ix.find(Kind::ALLREDUCE, p, st, -1));
      break;
    case Kind::BCAST_INV_A:
    case Kind::BCAST_INV_B: break;  // the previous refresh cycle's inverse: nothing of this step
    case Kind::OPT:
      need_all(ix.final_backward, std::pair{p, st});
      need(ix.find(Kind::ALLREDUCE, p, st, -1));
      need(ix.find(Kind::PREC, p, st, -1));
      break;
  }
}

}  // namespace

Dependencies build_dependencies(const Schedule& s) {
  const Index ix = build_index(s);
  Dependencies deps;
  deps.waits_for.resize(s.devices);
  deps.group_of.resize(s.devices);
  std::map<std::tuple<int, int, int, int>, int> group_ids;  // (kind, stage, layer, block) -> group
  for (int d = 0; d < s.devices; ++d) {
    const auto& order = s.per_device[d];
    deps.waits_for[d].resize(order.size());
    deps.group_of[d].assign(order.size(), -1);
    for (size_t i = 0; i < order.size(); ++i) {
      const Action& a = order[i];
      add_waits(s, ix, a, deps.waits_for[d][i]);
      if (!is_collective(a.kind)) continue;
      auto [it, fresh] = group_ids.emplace(std::tuple{static_cast<int>(a.kind), a.stage, a.layer, a.block},
                                           static_cast<int>(deps.groups.size()));
      if (fresh) deps.groups.emplace_back();
      deps.group_of[d][i] = it->second;
      deps.groups[it->second].push_back({d, static_cast<int>(i)});
    }
  }
  return deps;
}

UnitSteps unit_steps(const Schedule& s, const Dependencies& deps) {
  UnitSteps r;
  r.step.resize(s.devices);
  for (int d = 0; d < s.devices; ++d) r.step[d].assign(s.per_device[d].size(), -1);
  std::vector<size_t> next(s.devices, 0);
  size_t remaining = s.num_actions();
  // A dependency counts as done at step t if it ran at a step < t.
  auto ready = [&](int d, size_t i, int t) {
    for (const ActionRef& w : deps.waits_for[d][i]) {
      int ws = r.step[w.device][w.index];
      if (ws < 0 || ws >= t) return false;
    }
    return true;
  };
  std::vector<int> run;  // devices that run at this step
  for (int t = 0; remaining > 0; ++t) {
    run.clear();
    for (int d = 0; d < s.devices; ++d) {
      size_t i = next[d];
      if (i >= s.per_device[d].size() || !ready(d, i, t)) continue;
      int g = deps.group_of[d][i];
      if (g >= 0) {  // a collective runs only when every member is next in line and ready
        bool all = true;
        for (const ActionRef& m : deps.groups[g])
          all = all && next[m.device] == static_cast<size_t>(m.index) && ready(m.device, m.index, t);
        if (!all) continue;
      }
      run.push_back(d);
    }
    if (run.empty()) {
      r.complete = false;
      r.num_steps = t;
      return r;
    }
    for (int d : run) {
      r.step[d][next[d]++] = t;
      --remaining;
    }
    r.num_steps = t + 1;
  }
  return r;
}

}  // namespace pf
