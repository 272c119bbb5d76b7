#include "runtime/layout.hpp"

#include "core/error.hpp"
#include "nn/model.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "schedule/validate.hpp"
#include "sim/limits.hpp"

#include <numeric>

namespace pf {

namespace {

// The generators name their CLI flags; a run names the config keys.
[[noreturn]] void rethrow_with_keys(const UsageError& e) {
  std::string msg = e.what();
  for (auto [flag, key] : {std::pair{"--stages", "parallel.stages"}, {"--micro-batches", "parallel.micro_batches"},
                           {"--virtual-stages", "parallel.virtual_stages"}, {"--zb-memory", "parallel.zb_memory"}})
    if (msg.rfind(flag, 0) == 0) msg = key + msg.substr(std::string(flag).size());
  throw UsageError(msg);
}

bool runtime_handles(Kind k) {
  switch (k) {
    case Kind::F: case Kind::B: case Kind::I: case Kind::W: case Kind::SEND_F: case Kind::RECV_F:
    case Kind::SEND_B: case Kind::RECV_B: case Kind::ALLREDUCE: case Kind::OPT:
      return true;
    default:
      return false;
  }
}

// The keys that choose a generated schedule's order refused where they have no effect.
void check_order_keys(const ParallelConfig& p) {
  const std::string chosen = p.schedule_file.empty() ? fmt::format("\"{}\"", p.schedule) : "parallel.schedule_file";
  const bool timed = p.schedule == ScheduleName::Chimera || p.schedule == ScheduleName::ZbAuto ||
                     p.schedule == ScheduleName::ZbV;  // orders chosen for the durations
  if (p.backward_forward_ratio != ParallelConfig{}.backward_forward_ratio && (!timed || !p.schedule_file.empty()))
    usage_error("parallel.backward_forward_ratio",
                "only orders parallel.schedule = \"chimera\", \"zb-auto\" or \"zb-v\" (got {} with {})",
                p.backward_forward_ratio, chosen);
  if (p.zb_memory != ParallelConfig{}.zb_memory && (p.schedule != ScheduleName::ZbAuto || !p.schedule_file.empty()))
    usage_error("parallel.zb_memory", "only applies to parallel.schedule = \"zb-auto\" (got {} with {})", p.zb_memory,
                chosen);
}

Schedule compute_schedule(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  check_order_keys(p);
  if (!p.schedule_file.empty()) {
    Schedule s = read_schedule_file(p.schedule_file, "parallel.schedule_file");
    if (s.devices != p.stages)
      usage_error("parallel.schedule_file", "'{}' is for {} devices but parallel.stages = {}", p.schedule_file,
                  s.devices, p.stages);
    if (s.micro_batches != p.micro_batches)
      usage_error("parallel.schedule_file", "'{}' has {} micro-batches but parallel.micro_batches = {}",
                  p.schedule_file, s.micro_batches, p.micro_batches);
    // Two pipelines only as Chimera places them: the gradient groups pair device i with D-1-i.
    if (s.pipelines > 1 && (s.pipelines != 2 || s.stages != s.devices ||
                            s.stage_device != default_stage_device(s.devices, s.stages, 2)))
      usage_error("parallel.schedule_file", "'{}': two pipelines must be placed as Chimera's (stage s of the up "
                  "pipeline on device D-1-s, D stages per pipeline)", p.schedule_file);
    // Communication and optimizer actions are re-derived by lowering; anything else must have a handler.
    for (auto& list : s.per_device) {
      std::erase_if(list, [](const Action& a) {
        return is_p2p(a.kind) || a.kind == Kind::ALLREDUCE || a.kind == Kind::OPT;
      });
      for (const Action& a : list)
        if (!runtime_handles(a.kind))
          usage_error("parallel.schedule_file", "'{}': action {} has kind {}, which the runtime does not execute "
                      "(it runs F, B, I, W and their communication)", p.schedule_file, to_token(a), kind_name(a.kind));
    }
    return s;
  }
  if (p.virtual_stages != 1 && p.schedule != ScheduleName::Interleaved)
    usage_error("parallel.virtual_stages", "only applies to parallel.schedule = \"interleaved\" (got {} with \"{}\")",
                p.virtual_stages, p.schedule);
  // The simulator's bound (sim/limits.hpp): each micro-batch passes each model chunk as F and B
  // with a send and a receive each way.
  check_schedule_size(p.stages, schedule_size_bound(p.schedule, p.stages, p.micro_batches, p.virtual_stages), false,
                      p.stages > kMaxDevices ? "parallel.stages" : "parallel.micro_batches");
  try {
    // Zero-bubble orders for T_F = 1 and T_I = T_W = T_b / 2, as Chimera's for T_b / T_f.
    const ZbSpec zb{.forward = 1, .input_grad = p.backward_forward_ratio / 2, .weight_grad = p.backward_forward_ratio / 2,
                    .memory = p.zb_memory};
    return make_schedule(p.schedule, p.stages, p.micro_batches, p.virtual_stages, 1, p.backward_forward_ratio, zb);
  } catch (const UsageError& e) {
    rethrow_with_keys(e);
  }
}

}  // namespace

std::vector<int> partition_blocks(int layers, int stages, const std::vector<int>& explicit_counts,
                                  const PartitionKeys& keys) {
  if (!explicit_counts.empty()) {
    if (static_cast<int>(explicit_counts.size()) != stages)
      usage_error(keys.partition, "lists {} stages but the schedule has {} (one entry per stage{})",
                  explicit_counts.size(), stages, stages > 1 ? ", interleaved: stages x virtual_stages" : "");
    const int64_t sum = std::accumulate(explicit_counts.begin(), explicit_counts.end(), int64_t{0});
    if (sum != layers) usage_error(keys.partition, "assigns {} transformer blocks but {} = {}", sum, keys.layers, layers);
    for (int k = 1; k + 1 < stages; ++k)
      if (explicit_counts[k] == 0)
        usage_error(keys.partition, "stage {} gets no transformer block and holds nothing", k);
    return explicit_counts;
  }
  if (stages > layers)
    usage_error(keys.stages, "{} pipeline stages but the model has only {} transformer blocks "
                "({}; interleaved counts stages x virtual_stages)", stages, layers, keys.layers);
  std::vector<int> counts(stages, layers / stages);
  int extra = layers % stages;
  // The remainder goes to interior stages first: the ends also carry the embedding and the head.
  for (int k = 1; k + 1 < stages && extra > 0; ++k, --extra) ++counts[k];
  if (extra > 0) ++counts[0], --extra;
  if (extra > 0) ++counts[stages - 1], --extra;
  return counts;
}

Layout make_layout(const Config& given, int world_size) {
  Config cfg = given;
  resolve_data_parallel(cfg, world_size);
  const ParallelConfig& p = cfg.parallel;
  Layout L;
  L.devices = p.stages;
  L.replicas = p.data_parallel;
  L.micro_batches = p.micro_batches;
  if (world_size != p.stages * p.data_parallel)
    usage_error("parallel.stages", "the MPI world has {} rank{} but parallel.stages x parallel.data_parallel = {} x {} "
                "= {} (launch with scripts/pfrun -np {})", world_size, world_size == 1 ? "" : "s", p.stages, p.data_parallel,
                p.stages * p.data_parallel, p.stages * p.data_parallel);
  Schedule s = compute_schedule(cfg);
  validate(s);  // ScheduleError (a UsageError) with the grid
  const int S = s.stages;
  std::vector<int> counts = partition_blocks(cfg.model.layers, S, p.partition);
  int next = 1;
  for (int k = 0; k < S; ++k) {
    BlockRange r{next, next + counts[k] - 1};
    next += counts[k];
    if (k == 0) r.first = 0;
    if (k == S - 1) r.last = num_blocks(cfg.model) - 1;
    L.stage_blocks.push_back(r);
  }
  L.grad_sync = p.data_parallel > 1 || s.pipelines > 1;
  L.schedule = lower_communication(s, {L.grad_sync, true});
  return L;
}

}  // namespace pf
