#pragma once
// The PipeFisher profile a plan is made from, recorded, so that another run can plan from it
// (kfac.plan_profile) instead of from its own timings: the same plan, hence the same refresh
// pattern and the same losses, on every run of the same configuration.
//
// The record is one JSON object,
//   "pipefisher_plan": { "shape": {...}, "input": [doubles] }
// written by a bubbles run to out_dir/kfac_profile.json when it plans, and also into
// --profile-dir's profile.json. "input" is the all-reduced profile the executor feeds the planner
// (executor_kfac.cpp, ProfileShape: per-device action durations, per-stage K-FAC unit costs,
// factor sizes, the broadcast model); doubles round-trip exactly through JSON. "shape" names what
// the input's layout depends on (schedule, devices, replicas, micro-batches, partition, model
// sizes, K-FAC layers): a run plans only from a record of its own shape.
#include "config/config.hpp"
#include "runtime/layout.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pf {

nlohmann::json plan_shape(const Config& cfg, const Layout& layout);
// {"shape": plan_shape(...), "input": input}.
nlohmann::json plan_record(const Config& cfg, const Layout& layout, const std::vector<double>& input);
// The input recorded in cfg.kfac.plan_profile. UsageError naming kfac.plan_profile when the file
// cannot be read, holds no "pipefisher_plan" object, was recorded for another shape, or its input
// is not `size` finite non-negative numbers.
std::vector<double> read_plan_profile(const Config& cfg, const Layout& layout, size_t size);

}  // namespace pf
