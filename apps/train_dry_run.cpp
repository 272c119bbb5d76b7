#include "train_dry_run.hpp"

#include "command.hpp"
#include "config/limits.hpp"
#include "config/placement.hpp"
#include "core/peak_flops.hpp"
#include "kfac/factor.hpp"
#include "nn/flops.hpp"
#include "runtime/layout.hpp"
#include "sim/kfac_cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace pf::app {

namespace {

// What a pipeline's stage costs at the sgemm peak, as `plan` flags (ms): forward and backward of
// its share of the blocks for one micro-batch, and K-FAC's curvature (per micro-batch), inversions
// and precondition from the Linears' shapes (kfac/factor.hpp's flop counts).
std::vector<std::string> cost_model_flags(const Config& cfg, int stages, double peak) {
  const ModelConfig& m = cfg.model;
  const double blocks = static_cast<double>(m.layers) / stages;
  const double rows = static_cast<double>(cfg.parallel.micro_batch_size) * m.seq_len;
  const double block_macs = block_forward_macs_per_token(m);
  const double ms = 1e3 / peak;
  const double tf = 2 * block_macs * blocks * rows * ms;
  double curv = 0, inv = 0, prec = 0;
  for (const LinearShape& l : block_linears(m)) {
    curv += curvature_flops(l.d_in, 1, static_cast<int64_t>(rows)) + curvature_flops(l.d_out, 1, static_cast<int64_t>(rows));
    inv += inversion_flops(l.d_in, 1) + inversion_flops(l.d_out, 1);
    prec += 2.0 * l.d_out * l.d_in * (l.d_in + l.d_out);
  }
  return {"--tf",    fmt::format("{:.6g}", tf),
          "--tb",    fmt::format("{:.6g}", 2 * tf),
          "--tcurv", fmt::format("{:.6g}", curv * blocks * ms),
          "--tinv",  fmt::format("{:.6g}", inv * blocks * ms),
          "--tprec", fmt::format("{:.6g}", prec * blocks * ms)};
}

// The keys of the run that change PipeFisher's plan, as `plan` flags: what the run plans with.
std::vector<std::string> kfac_plan_flags(const KfacConfig& k) {
  std::vector<std::string> f = {"--kfac", "--min-refresh-steps", std::to_string(k.min_refresh_steps)};
  if (k.split_inversions) f.push_back("--split-to-shorten");
  return f;
}

// `pipefisher plan`'s flags for this run's layout: its schedule, and every key the run's own
// simulation and plan read (parallel.recompute, parallel.zb_memory, kfac_plan_flags).
std::vector<std::string> plan_flags(const Config& cfg, const Layout& layout, bool pipefisher) {
  const ParallelConfig& p = cfg.parallel;
  if (pipefisher && !cfg.kfac.plan_profile.empty()) {
    std::vector<std::string> f = kfac_plan_flags(cfg.kfac);
    f.insert(f.end(), {"--profile", cfg.kfac.plan_profile});
    return f;
  }
  std::vector<std::string> f;
  if (!p.schedule_file.empty()) f = {"--schedule-file", p.schedule_file};
  else f = {"--schedule", name_of(p.schedule), "--stages", std::to_string(layout.devices), "--micro-batches",
            std::to_string(layout.micro_batches)};
  if (p.schedule == ScheduleName::Interleaved) f.insert(f.end(), {"--virtual-stages", std::to_string(p.virtual_stages)});
  if (layout.replicas > 1) f.insert(f.end(), {"--data-parallel", std::to_string(layout.replicas)});
  if (p.schedule_file.empty() && p.schedule == ScheduleName::ZbAuto)
    f.insert(f.end(), {"--zb-memory", fmt::format("{:g}", p.zb_memory)});
  if (p.recompute) f.push_back("--recompute");
  const std::vector<std::string> costs = cost_model_flags(cfg, layout.stages(), sgemm_peak().flops_per_s);
  f.insert(f.end(), costs.begin(), costs.end());
  if (pipefisher) {
    const std::vector<std::string> k = kfac_plan_flags(cfg.kfac);
    f.insert(f.end(), k.begin(), k.end());
  }
  // The run's own model sizes the memory model (and splits K-FAC's costs).
  f.insert(f.end(), {"--layers-per-stage", std::to_string(std::max(1, cfg.model.layers / layout.stages())),
                     "--micro-batch-size", std::to_string(p.micro_batch_size), "--seq-len",
                     std::to_string(cfg.model.seq_len)});
  if (!cfg.model.preset.empty()) f.insert(f.end(), {"--model", cfg.model.preset});
  return f;
}

// Runs `pipefisher plan` with these flags, in this process (its report on stdout).
int run_plan(const std::vector<std::string>& flags) {
  for (const Command& c : commands()) {
    if (c.name != "plan") continue;
    CLI::App app;
    const Runner run = c.setup(app);
    std::vector<std::string> reversed(flags.rbegin(), flags.rend());  // CLI11 takes them last first
    app.parse(reversed);
    fmt::print("plan: pipefisher plan {}\n", fmt::join(flags, " "));
    std::fflush(stdout);
    return run();
  }
  return 0;
}

}  // namespace

int train_dry_run(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int ranks = p.stages * p.data_parallel;
  const double peak = estimate_peak_bytes(cfg, ranks, ranks);
  const MachineMemory available = machine_memory();
  for (const std::string& w : config_warnings(cfg)) std::fprintf(stderr, "pipefisher: warning: %s\n", w.c_str());
  fmt::print("dry run: the configuration and every input check out; nothing was written\n");
  fmt::print("memory: at most {} per rank ({} for {} rank{} on this host), {} available ({})\n",
             format_bytes(peak / ranks), format_bytes(peak), ranks, ranks > 1 ? "s" : "", format_bytes(available.bytes),
             available.source);
  if (ranks == 1) return 0;
  const Layout layout = make_layout(cfg, ranks);
  const bool pipefisher = cfg.kfac.enabled && placement_spec(cfg.kfac).planned;
  if (pipefisher && cfg.kfac.plan_profile.empty())
    fmt::print("costs: a model of the FLOPs at this machine's sgemm peak (kfac.plan_profile names a recorded profile "
               "instead)\n");
  std::fflush(stdout);
  return run_plan(plan_flags(cfg, layout, pipefisher));
}

}  // namespace pf::app
