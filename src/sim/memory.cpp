#include "sim/memory.hpp"

#include "sim/kfac_cost.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace pf {

StageMemory block_memory(const ModelConfig& m, int blocks, int micro_batch_size) {
  const double h = m.hidden, f = m.ffn, T = m.seq_len, B = micro_batch_size, n = B * T, H = m.heads;
  const double mb = 4.0 / kBytesPerMB * blocks;  // floats of one block -> MB of the stage
  double d_out = 0, kron = 0;
  for (const LinearShape& l : block_linears(m)) {
    d_out += l.d_out;
    kron += double(l.d_in) * l.d_in + double(l.d_out) * l.d_out;
  }
  StageMemory s;
  s.param = (4 * h * h + 2 * h * f + 9 * h + f) * mb;
  s.act = (n * (9 * h + 2 * f) + B * H * T * T) * mb;
  s.err_peak = (n * (2 * h + f) + B * H * T * T) * mb;
  if (m.arch == Arch::Llama) {  // nn/llama_block.cpp: no biases, SwiGLU's three matrices, k and v of width kv
    const double kv = kv_width(m);
    s.param = (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) * mb;
    s.act = (n * (8 * h + 2 * kv + 3 * f) + B * H * T * T) * mb;
    s.err_peak = (n * (3 * h + f) + B * H * T * T) * mb;
  }
  s.err_save = n * d_out * mb;
  s.kron = kron * mb;
  s.deferred = s.err_save;
  return s;
}

MemoryReport memory_model(const Schedule& s, const Timeline& tl, const std::vector<StageMemory>& stages,
                          bool recompute) {
  auto mem = [&](int st) -> const StageMemory& { return stages.size() == 1 ? stages[0] : stages.at(st); };
  MemoryReport worst;
  double worst_total = -1;
  for (int d = 0; d < s.devices; ++d) {
    MemoryReport r;
    r.device = d;
    std::map<std::pair<int, int>, int> processed;  // (pipeline, stage) -> micro-batches forwarded
    std::map<std::pair<int, int>, int> split;      // (pipeline, stage) -> split backwards (I) run
    std::vector<std::pair<double, double>> ev;     // (time, +-M_act) for the held-activation peak
    for (const TimedAction& t : tl.per_device[d]) {
      const Action& a = t.action;
      if (a.kind == Kind::F) {
        ++processed[{a.pipeline, a.stage}];
        ev.push_back({t.start, mem(a.stage).act});
      }
      if (a.kind == Kind::I) {
        ++split[{a.pipeline, a.stage}];
        ev.push_back({t.end, mem(a.stage).deferred});
      }
      if (a.kind == Kind::B) ev.push_back({t.end, -mem(a.stage).act});
      if (a.kind == Kind::W) ev.push_back({t.end, -mem(a.stage).act - mem(a.stage).deferred});
    }
    for (auto [ps, n] : processed) {
      const StageMemory& m = mem(ps.second);
      r.params += 2 * m.param;
      r.activations += (recompute ? 1 : n) * m.act + (recompute ? 0 : split[ps]) * m.deferred;
      r.err_peak = std::max(r.err_peak, m.err_peak);
      r.curv += m.kron / s.pipelines;  // per stage (the paper's M_curv): Chimera's copies count once
      r.err_save += n * m.err_save;
    }
    std::sort(ev.begin(), ev.end());  // at equal times frees (negative) come first
    double cur = 0;
    for (auto [time, delta] : ev) r.activations_in_flight = std::max(r.activations_in_flight, cur += delta);
    if (recompute) r.activations_in_flight = r.activations;  // one micro-batch per stage at a time
    r.inv = r.curv;
    r.m_pipe = r.params + r.activations + r.err_peak;
    r.m_pipe_in_flight = r.params + r.activations_in_flight + r.err_peak;
    r.m_kfac = r.curv + r.inv + r.err_save;
    if (r.m_pipe + r.m_kfac > worst_total) {
      worst_total = r.m_pipe + r.m_kfac;
      worst = r;
    }
  }
  return worst;
}

}  // namespace pf
