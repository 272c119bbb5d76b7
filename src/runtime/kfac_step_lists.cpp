// Which list a step runs (runtime/README.md): the inline list while profiling (and always with
// kfac.placement inline / skip), the plan's lists in steady state, a drain's plain lists before a
// re-plan; what each ChunkKfac does at step start; the profile's timings at step end.
#include "runtime/executor.hpp"

#include "core/error.hpp"
#include "runtime/executor_parts.hpp"

#include <algorithm>

namespace pf {

const std::vector<Action>& Executor::step_actions(int64_t step) const {
  if (!kfac_) return actions_;
  const KfacState& k = *kfac_;
  if (k.replan_at >= 0 && step == k.replan_at) return k.reprofile_first;
  if (k.profiling(step)) return k.inline_list;
  if (k.draining(step)) return step == k.boundary ? k.drain_first : k.drain_plain;
  return k.plan->actions(groups_.replica, device_, step - k.plan_start);
}

bool Executor::kfac_begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  KfacState& k = *kfac_;
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  for (size_t i = 0; i < k.chunk.size(); ++i) {
    ChunkKfac* ck = k.chunk[i].get();
    if (!k.bubbles) {
      const bool curvature = ck->pre().curvature_step(step);
      ck->begin_step(step, false, curvature, scale);
      // The DistributedKfac marks a factor complete at its chunk's last micro-batch of the step.
      if (curvature && !k.dist.empty())
        k.dist[i]->begin_step(mbs.at(static_cast<size_t>(groups_.replica) * layout_.micro_batches +
                                     chunks_[i]->last_backward_mb).index);
    } else if (k.profiling(step)) {
      ck->begin_step(step, true, false, scale);  // profiling: save, then timed units at PREC
    } else if (k.draining(step)) {
      ck->begin_step(step, false, false, scale);  // no new cycle before re-profiling
    } else {
      ck->begin_step(step, k.plan->is_cycle_start(device_, step - k.plan_start), false, scale);
    }
  }
  return k.bubbles;  // stamps: profiling, and the drift check
}

void Executor::kfac_end_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  KfacState& k = *kfac_;
  if (!k.bubbles) return;
  if (!k.profiling(step)) {
    // A recorded profile fixes the plan: no re-plan from this run's timings.
    if (k.replan_at < 0 && cfg_.kfac.replan_on_drift && !k.recorded) {
      double compute = 0;
      for (size_t i = 0; i < list.size() && i < times.size(); ++i) {
        const Kind kd = list[i].kind;
        if (kd == Kind::F || kd == Kind::B || kd == Kind::I || kd == Kind::W)
          compute += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
      }
      kfac_drift(step, compute);
    }
    return;
  }
  if (step == k.profile_start) {  // a fresh profile
    std::fill(k.dur_sum.begin(), k.dur_sum.end(), 0.0);
    k.dur_samples = 0;
    for (ChunkKfacTimes& t : k.times) t = {};
  }
  // The inline list ends the step's list; the first step of a re-profile may start with the old
  // cycle's wrapped units (kfac_drain_lists), which are not part of the profile.
  PF_CHECK(list.size() >= k.lowered_index.size() && times.size() == list.size(),
           "profiled step {}: {} actions, {} times, inline list of {}", step, list.size(), times.size(),
           k.lowered_index.size());
  const size_t skip = list.size() - k.lowered_index.size();
  for (size_t i = skip; i < list.size(); ++i) {
    const int j = k.lowered_index[i - skip];
    if (j >= 0) k.dur_sum[j] += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  }
  ++k.dur_samples;
  if (step + 1 == k.profile_start + kProfileSteps) {
    k.plan_start = step + 1;
    k.replan_at = -1;
    kfac_plan();
  }
}

// The lists of a drain (boundary .. replan_at) and of its re-profiling step, from the plan.
void Executor::kfac_drain_lists() {
  KfacState& k = *kfac_;
  const KfacPlan& p = *k.plan;
  // The cycle's units wrapped into the next cycle's leading gap (the front of cycle step 0) still
  // run, first thing at the boundary; then only F/B, communication, PREC and OPT.
  // (Chimera's group wraps inversions up to cycle step K: those of steps 1..K do not run; their
  // inverses would be pending until a sync that does not come, and re-profiling drops them.)
  const std::vector<Action> wrapped = p.wrapped(groups_.replica, device_, 0);
  k.drain_plain = p.plain_actions(groups_.replica, device_);
  k.drain_first = wrapped;
  k.drain_first.insert(k.drain_first.end(), k.drain_plain.begin(), k.drain_plain.end());
  k.reprofile_first = k.boundary == k.replan_at ? wrapped : std::vector<Action>{};
  k.reprofile_first.insert(k.reprofile_first.end(), k.inline_list.begin(), k.inline_list.end());
  k.profile_start = k.replan_at;
}

}  // namespace pf
