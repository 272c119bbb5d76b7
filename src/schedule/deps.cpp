#include "schedule/deps.hpp"

#include "schedule/kfac_graph.hpp"

#include <map>
#include <tuple>

namespace pf {

namespace {

// The schedule's actions in the K-FAC graph's index (kfac_graph.hpp), numbered device by device.
struct Index {
  KfacIndex kfac;
  std::vector<ActionRef> ref;  // [number]

  const ActionRef* find(Kind k, int p, int s, int m, int l = -1) const {
    const int n = kfac.find(k, p, s, m, l);
    return n < 0 ? nullptr : &ref[n];
  }
  void add(const std::vector<int>& numbers, std::vector<ActionRef>& w) const {
    for (int n : numbers) w.push_back(ref[n]);
  }
};

Index build_index(const Schedule& s) {
  Index ix;
  ix.kfac.reserve(s.num_actions());
  for (int d = 0; d < s.devices; ++d)
    for (int i = 0; i < static_cast<int>(s.per_device[d].size()); ++i) {
      ix.kfac.add(s.per_device[d][i]);
      ix.ref.push_back({d, i});
    }
  return ix;
}

// What action `a` waits for (the table in deps.hpp; K-FAC units: kfac_graph.hpp), appended to w.
void add_waits(const Schedule& s, const Index& ix, const Action& a, std::vector<ActionRef>& w) {
  auto need = [&](const ActionRef* r) {
    if (r) w.push_back(*r);
  };
  auto backward = [&](int st) {  // B or I of (pipeline, st, mb)
    const ActionRef* r = ix.find(Kind::B, a.pipeline, st, a.micro_batch);
    return r ? r : ix.find(Kind::I, a.pipeline, st, a.micro_batch);
  };
  auto final_backwards = [&] {
    std::vector<int> n;
    ix.kfac.every(kFinalBackwards, a.pipeline, a.stage, -1, n);
    ix.add(n, w);
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
    case Kind::ALLREDUCE: final_backwards(); break;
    case Kind::OPT:
      final_backwards();
      need(ix.find(Kind::ALLREDUCE, p, st, -1));
      need(ix.find(Kind::PREC, p, st, -1));
      break;
    case Kind::CURV_A:
    case Kind::CURV_B:
    case Kind::SYNC_CURV:
    case Kind::INV_A:
    case Kind::INV_B:
    case Kind::PREC:
    case Kind::BCAST_INV_A:
    case Kind::BCAST_INV_B:
    case Kind::EIG_L:
    case Kind::EIG_R:
    case Kind::STAT: {  // the K-FAC and SOAP units: what they read (a recomputed CURV_A's backward
                               // precedes it in its device's list)
      std::vector<int> n;
      ix.kfac.reads(a, {}, n);
      ix.add(n, w);
      break;
    }
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
