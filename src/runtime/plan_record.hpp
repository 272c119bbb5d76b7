#pragma once
// The PipeFisher profile a plan is made from (PlanProfile, sim/profile.hpp) in the runtime: its
// wire form, which the ranks all-reduce, and its record, so that another run can plan from it
// (kfac.plan_profile) instead of from its own timings: the same plan, hence the same refresh
// pattern and the same losses, on every run of the same configuration.
//
// The record is the project's profile JSON (sim/profile.hpp), written by a bubbles run to
// out_dir/kfac_profile.json when it plans and carried into --profile-dir's profile.json: each
// stage's K-FAC units (the mean over its holders), the broadcast model, and
//   "pipefisher_plan": { "shape": {...}, "action_ms": [[...], ...] }
// (per-device action durations of the lowered step). "shape" names what their layout depends on
// (schedule, devices, replicas, micro-batches, partition, model sizes, K-FAC layers): a run plans
// only from a record of its own shape. Doubles round-trip exactly through JSON.
#include "config/config.hpp"
#include "runtime/layout.hpp"
#include "sim/profile.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pf {

// The kinds whose measured times the planner takes (F, B, I, W, OPT); every other action's
// time stays 0 in the profile.
bool planner_measures(Kind k);
// Each pass of `lowered` (a device's list) at its kind's median on the device (ms, in place): a
// profiled step's first forward runs long (plan_record.cpp).
void passes_at_their_median(const std::vector<Action>& lowered, std::vector<double>& ms);

// The profile's wire form: one vector of doubles that the ranks all-reduce (sum). Each rank
// writes its device's action times (already divided by the replicas, so that the sum is their
// mean) and adds each stage it holds once per copy. Layout: the action times of every device in
// turn, then per stage `per_stage` values (holders, layers, PREC, per field Lmax layer slots of
// CURV_A, CURV_B, INV_A, INV_B, d_in, d_out, diagonal B, and last the sync), then the broadcast
// model's alpha and beta. The one place that knows offsets.
struct ProfileLayout {
  explicit ProfileLayout(const Layout& layout);
  std::vector<size_t> off;  // [device] first index of its actions; off[devices] = the stages' start
  int Lmax = 1;             // layer slots per stage
  size_t per_stage = 0, size = 0;
  int ranks = 1;            // devices x replicas: the broadcast model is summed over them
  bool broadcast = false;   // the planner uses a broadcast model (replicas or Chimera's twins)

  std::vector<double> zeros() const;
  void set_actions(std::vector<double>& wire, int device, const std::vector<double>& ms) const;
  void add_stage(std::vector<double>& wire, int stage, const StageKfacCost& holder) const;  // holders += 1
  void add_broadcast(std::vector<double>& wire, double alpha, double beta) const;
  // The summed wire as the planner's input: each stage's mean over its holders (divided by 1
  // when none reported), the broadcast model's over the ranks (none without `broadcast`).
  // PF_CHECK: size. The shape is left null.
  PlanProfile mean(const std::vector<double>& wire) const;
};

nlohmann::json plan_shape(const Config& cfg, const Layout& layout);
// The run's shape as a profile's "run" object (ProfileRun).
nlohmann::json profile_run(const Config& cfg, const Layout& layout);
// What a record says of its run besides the times, taken from the configuration once: the shape
// it plans for (plan_shape), its "run" object (profile_run), the micro-batch size.
struct PlanRecordRun {
  nlohmann::json shape, run;
  int micro_batch_size = 0;
};
PlanRecordRun plan_record_run(const Config& cfg, const Layout& layout);
// The record: a profile JSON of `p`, each stage's forward, backward (input_grad and weight_grad
// when split) and optimizer the mean of its actions' recorded times.
nlohmann::json plan_profile_json(const PlanRecordRun& run, const Layout& layout, const PlanProfile& p);
nlohmann::json plan_profile_json(const Config& cfg, const Layout& layout, const PlanProfile& p);
// The profile recorded in cfg.kfac.plan_profile (a run's kfac_profile.json or --profile-dir's
// profile.json). UsageError naming kfac.plan_profile when the file cannot be read, is not JSON,
// holds no "pipefisher_plan" object, was recorded for another shape, or its action times or
// K-FAC units do not fit this layout, or holds the other optimizer's units (K-FAC's or SOAP's).
PlanProfile read_plan_profile(const Config& cfg, const Layout& layout);

}  // namespace pf
