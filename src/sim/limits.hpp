#pragma once
// What the simulator and the planner accept: durations and sizes within what a double resolves,
// and schedules within a stated amount of work. Every refusal is a UsageError naming the flag,
// key or profile field, never a failed check deeper in.
//
//   durations   finite, >= 0 and at most kMaxDuration: 2^53 microseconds (in ms), the longest
//               time a double still resolves to the microsecond (285 years); a simulated or
//               planned step must stay within it too
//   bytes, MB   finite, >= 0 and at most kMaxBytes (2^53)
//   schedules   the simulator: at most kMaxDevices devices and kMaxActions actions (F, B, W,
//               sends, receives...; measured on this 2-core machine: 1M actions 0.5 s and 70 MB,
//               4096 devices x 40 micro-batches 1.2 s: a few seconds at the bound). The PipeFisher
//               planner, which simulates many placements and grows about with the square of a
//               device's list: at most kMaxPlannedActions actions and K-FAC units in all and
//               kMaxPlannedPerDevice per device (measured: D = 8, N = 400: 58k in all, 7.2k per
//               device, 4.5 s; D = 32, N = 96: 3.3 s; beyond, D = 2, N = 1600: 50 s)
#include "sim/profile.hpp"

#include <cstdint>
#include <string>

namespace pf {

constexpr double kMaxDuration = 9007199254740.992;  // ms = 2^53 us
constexpr double kMaxBytes = 9007199254740992.0;    // 2^53
constexpr int64_t kMaxDevices = 4096;
constexpr int64_t kMaxActions = 4'000'000;
constexpr int64_t kMaxPlannedActions = 60'000;
constexpr int64_t kMaxPlannedPerDevice = 8'000;

// Returns v, or throws UsageError("<what>: must be a finite number of ms in [0, 9.007e+12] ...").
double check_duration(double v, const std::string& what);
// Every duration and size of a profile (after scaling, e.g. by --layers-per-stage).
void check_profile(const Profile& p, const std::string& what);
// Refuses a schedule with more than the simulator's (planned = false) or the planner's (true:
// in all, and per device on average) actions, or more than kMaxDevices devices, naming `what`.
void check_schedule_size(int64_t devices, int64_t actions, bool planned, const std::string& what);
// Refuses a simulated or planned step time that is not finite or exceeds kMaxDuration.
void check_step_time(double step_time, const std::string& what);

// TEST HOOK (fuzzers): lower work limits, so that every accepted input runs fast.
void set_work_limits(int64_t max_actions, int64_t max_planned_actions, int64_t max_planned_per_device);

}  // namespace pf
