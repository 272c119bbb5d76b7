#pragma once
// Where PipeFisher's plan comes from (kfac.plan_profile): this run's profiling steps
// (ProfiledPlan), or a profile recorded by an earlier run (RecordedPlan), which gives every run of
// the same configuration the same plan. Chosen once, by pipefisher_options (pipefisher_options.hpp).
#include "sim/profile.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace pf {

inline constexpr int kProfileSteps = 2;  // inline, timed K-FAC steps a profiled plan is made from

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  // The profile every rank plans from at the profile's end (the same bits on every rank);
  // `measured` all-reduces this run's profiling steps (collective: called on every rank or none).
  virtual PlanProfile profile(const std::function<PlanProfile()>& measured) const = 0;
  // The plan's line: what it was planned from, for the profile of steps [profile_start, plan_start).
  virtual std::string from(int64_t profile_start, int64_t plan_start) const = 0;
};

class ProfiledPlan final : public PlanSource {
 public:
  PlanProfile profile(const std::function<PlanProfile()>& measured) const override { return measured(); }
  std::string from(int64_t profile_start, int64_t plan_start) const override {
    return fmt::format("{} profiled steps (steps {}-{})", kProfileSteps, profile_start + 1, plan_start);
  }
};

class RecordedPlan final : public PlanSource {
 public:
  RecordedPlan(PlanProfile recorded, std::string path) : recorded_(std::move(recorded)), path_(std::move(path)) {}
  PlanProfile profile(const std::function<PlanProfile()>&) const override { return recorded_; }
  std::string from(int64_t, int64_t) const override { return fmt::format("kfac.plan_profile = {}", path_); }

 private:
  PlanProfile recorded_;
  std::string path_;
};

}  // namespace pf
