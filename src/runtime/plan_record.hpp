#pragma once
// The PipeFisher profile a plan is made from, recorded, so that another run can plan from it
// (kfac.plan_profile) instead of from its own timings: the same plan, hence the same refresh
// pattern and the same losses, on every run of the same configuration.
//
// The record is one JSON object,
//   "pipefisher_plan": { "shape": {...}, "input": [doubles] }
// written by a bubbles run to out_dir/kfac_profile.json when it plans, and also into
// --profile-dir's profile.json. "input" is the all-reduced profile the executor feeds the planner
// (ProfileLayout below: per-device action durations, per-stage K-FAC unit costs,
// factor sizes, the broadcast model); doubles round-trip exactly through JSON. "shape" names what
// the input's layout depends on (schedule, devices, replicas, micro-batches, partition, model
// sizes, K-FAC layers): a run plans only from a record of its own shape.
#include "config/config.hpp"
#include "runtime/layout.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pf {

// The profile a plan is made from, typed. Each holder of a stage adds its own numbers (so a
// stage's fields are sums over its `holders`; mean() divides them); action times are this
// rank's, already divided by the replicas so that the all-reduce gives their mean.
struct LayerProfile {  // one K-FAC Linear
  double curv_a = 0, curv_b = 0;   // ms per micro-batch
  double inv_a = 0, inv_b = 0;     // ms, the whole factor
  double d_in = 0, d_out = 0;      // factor sizes
  double diagonal_b = 0;           // 1: B kept diagonal
};
struct StageProfile {
  double holders = 0;              // how many ranks added theirs
  double layers = 0;               // K-FAC layers of the stage (per holder, summed)
  double precondition = 0, sync = 0;  // ms per step (PREC), per cycle (SYNC_CURV)
  std::vector<LayerProfile> layer; // [Lmax] (the slots past `layers` stay 0)
  StageProfile mean() const;       // every field over max(1, holders); holders = 1
  int layer_count() const;         // layers / holders, rounded
};
struct PlanProfile {
  std::vector<std::vector<double>> action_ms;  // [device][index in its lowered list] ms
  std::vector<StageProfile> stages;            // [stage]
  double bcast_alpha = 0, bcast_beta = 0;      // broadcast model (W > 1 or Chimera), summed over ranks
};

// The profile's wire form: one vector of doubles (what the ranks all-reduce and the record's
// "input" holds): the action times of every device in turn, then per stage `per_stage` values
// (holders, layers, PREC, per field Lmax layer slots of CURV_A, CURV_B, INV_A, INV_B, d_in,
// d_out, diagonal B, and last the sync), then alpha and beta. The one place that knows offsets.
struct ProfileLayout {
  explicit ProfileLayout(const Layout& layout);
  std::vector<size_t> off;  // [device] first index of its actions; off[devices] = the stages' start
  int Lmax = 1;             // layer slots per stage
  size_t per_stage = 0, size = 0;
  PlanProfile empty() const;  // zeros, of this layout's shape
  std::vector<double> flatten(const PlanProfile& p) const;
  PlanProfile unflatten(const std::vector<double>& v) const;  // PF_CHECK: size
};

nlohmann::json plan_shape(const Config& cfg, const Layout& layout);
// {"shape": plan_shape(...), "input": input}.
nlohmann::json plan_record(const Config& cfg, const Layout& layout, const std::vector<double>& input);
// The input recorded in cfg.kfac.plan_profile. UsageError naming kfac.plan_profile when the file
// cannot be read, holds no "pipefisher_plan" object, was recorded for another shape, or its input
// is not `size` finite non-negative numbers.
std::vector<double> read_plan_profile(const Config& cfg, const Layout& layout, size_t size);

}  // namespace pf
