#include "sim/limits.hpp"

#include "core/error.hpp"

#include <atomic>
#include <cmath>

namespace pf {

namespace {
std::atomic<int64_t> g_max_actions{kMaxActions}, g_max_planned{kMaxPlannedActions},
    g_max_per_device{kMaxPlannedPerDevice};
}

void set_work_limits(int64_t max_actions, int64_t max_planned_actions, int64_t max_planned_per_device) {
  g_max_actions.store(max_actions);
  g_max_planned.store(max_planned_actions);
  g_max_per_device.store(max_planned_per_device);
}

double check_duration(double v, const std::string& what) {
  if (!std::isfinite(v) || v < 0 || v > kMaxDuration)
    usage_error(what, "must be a finite number of ms in [0, {:.4g}] (2^53 us: a double's microsecond range), got {}",
                kMaxDuration, v);
  return v;
}

void check_profile(const Profile& p, const std::string& what) {
  auto time = [&](double v, const char* field, size_t s) {
    if (!std::isfinite(v) || v > kMaxDuration)
      usage_error(what, "stage {} {}: {} ms is beyond {:.4g} ms (2^53 us: a double's microsecond range)", s, field, v,
                  kMaxDuration);
  };
  auto size = [&](double v, const char* field, size_t s) {
    if (!std::isfinite(v) || v > kMaxBytes) usage_error(what, "stage {} {}: {} is beyond 2^53", s, field, v);
  };
  for (size_t s = 0; s < p.cost.stages.size(); ++s) {
    const StageCost& c = p.cost.stages[s];
    for (auto [v, f] : {std::pair{c.forward, "forward"}, {c.backward, "backward"}, {c.input_grad, "input_grad"},
                        {c.weight_grad, "weight_grad"}, {c.curvature, "curvature"}, {c.inversion, "inversion"},
                        {c.precondition, "precondition"}, {c.optimizer, "optimizer"}})
      time(v, f, s);
    for (auto [v, f] : {std::pair{c.activation_bytes, "activation_bytes"}, {c.grad_bytes, "grad_bytes"},
                        {c.curvature_bytes, "curvature_bytes"}})
      size(v, f, s);
  }
  for (size_t s = 0; s < p.memory.size(); ++s) {
    const StageMemory& m = p.memory[s];
    for (auto [v, f] : {std::pair{m.param, "mem_param"}, {m.act, "mem_act"}, {m.err_peak, "mem_peak_err"},
                        {m.err_save, "mem_save_err"}, {m.kron, "mem_kron"}, {m.deferred, "mem_deferred"}})
      size(v, f, s);
  }
  time(p.cost.p2p_latency, "p2p latency", 0);
  time(p.cost.allreduce_alpha, "allreduce alpha", 0);
  time(p.cost.allreduce_beta, "allreduce beta", 0);
  size(p.cost.p2p_bandwidth, "p2p bandwidth", 0);
}

void check_schedule_size(int64_t devices, int64_t actions, bool planned, const std::string& what) {
  if (devices > kMaxDevices)
    usage_error(what, "{} devices, more than the {} the simulator takes (sim/limits.hpp)", devices, kMaxDevices);
  const int64_t limit = planned ? g_max_planned.load() : g_max_actions.load();
  if (actions > limit)
    usage_error(what, "about {} actions per step, more than the {} the {} takes (sim/limits.hpp: it would run for "
                "minutes or more)", actions, limit, planned ? "PipeFisher planner" : "simulator");
  const int64_t per_device = devices > 0 ? actions / devices : actions;
  if (planned && per_device > g_max_per_device.load())
    usage_error(what, "about {} actions per device and step, more than the {} the PipeFisher planner takes "
                "(sim/limits.hpp: its time grows with the square of a device's list)", per_device,
                g_max_per_device.load());
}

void check_step_time(double step_time, const std::string& what) {
  if (!std::isfinite(step_time) || step_time > kMaxDuration)
    usage_error(what, "the step takes {} ms, beyond {:.4g} ms (2^53 us: a double's microsecond range); durations or "
                "message sizes are too large", step_time, kMaxDuration);
}

}  // namespace pf
