#include "sim/sweep.hpp"

#include "core/error.hpp"
#include "schedule/generators.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace pf {

std::vector<SweepRow> run_sweep(const SweepSpec& spec, const std::vector<Profile>& profiles) {
  std::vector<SweepRow> rows;
  for (const Profile& measured : profiles) {
    Profile prof = measured;
    if (spec.recompute) add_recomputation(prof.cost);  // R: the backward repeats the forward first
    for (int D : spec.stages)
      for (int k : spec.n_multiples) {
        const int N = k * D;
        Schedule s;
        try {
          s = make_schedule(spec.schedule, D, N, spec.virtual_stages, 1, prof.cost.backward_forward_ratio(),
                            zb_spec(prof.cost, spec.zb_memory));
        } catch (const UsageError&) {
          continue;  // undefined here
        }
        Timeline tl = simulate(s, prof.cost);
        MemoryReport mem = memory_model(s, tl, prof.memory, spec.recompute);
        SweepRow r;
        r.schedule = spec.schedule;
        r.micro_batch_size = prof.micro_batch_size;
        r.stages = D;
        r.micro_batches = N;
        r.t_pipe = tl.step_time;
        r.t_bubble = tl.mean_bubble();
        for (int d = 0; d < s.devices; ++d) {
          std::map<std::pair<int, int>, int> processed;  // hosted (pipeline, stage) -> micro-batches
          for (const TimedAction& t : tl.per_device[d])
            if (t.action.kind == Kind::F) ++processed[{t.action.pipeline, t.action.stage}];
          // Per stage as the paper defines them: a stage's copies (Chimera's two pipelines) share
          // its inversion and precondition (the planner's stage groups share the inversions);
          // curvature is per micro-batch where it ran.
          double prec = 0, curv_inv = 0;
          for (auto [ps, n] : processed) {
            const StageCost& c = prof.cost.stage(ps.second);
            prec += c.precondition / s.pipelines;
            curv_inv += n * c.curvature + c.inversion / s.pipelines;
          }
          r.t_prec = std::max(r.t_prec, prec);
          r.t_curv_inv = std::max(r.t_curv_inv, curv_inv);
        }
        r.ratio = r.t_bubble > 0 ? r.t_curv_inv / r.t_bubble : INFINITY;
        const double seqs = static_cast<double>(prof.micro_batch_size) * N, per_s = 1000.0 / spec.ms_per_unit;
        r.throughput_pipe = seqs / r.t_pipe * per_s;
        r.throughput_pipefisher = seqs / (r.t_pipe + r.t_prec) * per_s;
        r.throughput_kfac = seqs / (r.t_pipe + r.t_prec + r.t_curv_inv) * per_s;
        const double every = std::isfinite(r.ratio) ? std::max(1.0, std::ceil(r.ratio)) : 1.0;
        r.throughput_kfac_skip = seqs / (r.t_pipe + r.t_prec + r.t_curv_inv / every) * per_s;
        r.m_pipe = mem.m_pipe;
        r.m_kfac = mem.m_kfac;
        r.recompute = spec.recompute;
        rows.push_back(r);
      }
  }
  return rows;
}

std::string sweep_csv(const std::vector<SweepRow>& rows) {
  std::string o =
      "schedule,micro_batch_size,stages,micro_batches,t_pipe,t_bubble,t_prec,t_curv_inv,ratio,"
      "throughput_pipe,throughput_pipefisher,throughput_kfac,throughput_kfac_skip,m_pipe,m_kfac,recompute\n";
  for (const SweepRow& r : rows)
    o += fmt::format("{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{}\n",
                     r.schedule, r.micro_batch_size, r.stages, r.micro_batches, r.t_pipe, r.t_bubble, r.t_prec,
                     r.t_curv_inv, r.ratio, r.throughput_pipe, r.throughput_pipefisher, r.throughput_kfac,
                     r.throughput_kfac_skip, r.m_pipe, r.m_kfac, r.recompute ? 1 : 0);
  return o;
}

}  // namespace pf
