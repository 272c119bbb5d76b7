#include "sim/traced_run.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "sim/profile.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

namespace pf {

namespace {

using nlohmann::json;

json parse_trace(const std::string& path, const std::string& flag) {
  const std::string text = read_input_file(path, flag, size_t{1} << 30);
  try {
    json j = json::parse(text);
    if (j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array()) return j;
  } catch (const json::exception& e) {
    usage_error(flag, "'{}' is not valid JSON: {}", path, e.what());
  }
  usage_error(flag, "'{}' holds no \"traceEvents\" (a --profile-dir's trace.json)", path);
}

double number_arg(const json& args, const char* key) {
  const auto it = args.find(key);
  return it != args.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// The steps track (chrome_trace: one "X" event per step with args.step): each step's start, us.
std::map<int, double> step_starts(const json& events, size_t ranks) {
  std::map<int, double> starts;
  for (const json& e : events)
    if (e.value("cat", "") == "step" && e.value("ph", "") == "X" && e.value("pid", size_t{0}) == ranks)
      starts[e["args"]["step"].get<int>()] = e["ts"].get<double>();
  return starts;
}

// An action of the trace: a schedule token, or an inline refresh's curvature unit, which covers
// every micro-batch of its step and is written with micro-batch -1 ("0CURV_A-1l3").
Action traced_action(const std::string& token, const std::string& where) {
  const size_t all = token.find("-1");
  if (all == std::string::npos) return parse_token(token, where);
  Action a = parse_token(token.substr(0, all) + "0" + token.substr(all + 2), where);
  if (a.kind != Kind::CURV_A && a.kind != Kind::CURV_B) parse_token(token, where);  // refused as malformed
  a.micro_batch = -1;
  return a;
}

// The devices' events in file order, which is each rank's list order (chrome_trace writes them so).
std::vector<TracedStep> steps_of(const json& events, const std::string& where) {
  size_t ranks = 0;
  for (const json& e : events)
    if (e.value("name", "") == "process_name" && e["args"].value("name", "").rfind("device ", 0) == 0) ++ranks;
  const std::map<int, double> starts = step_starts(events, ranks);
  std::map<int, TracedStep> steps;
  for (const auto& [k, t0] : starts) steps[k] = {.step = k, .step_time = 0, .per_rank = std::vector<std::vector<TracedAction>>(ranks)};
  for (const json& e : events) {
    if (e.value("ph", "") != "X" || e.value("cat", "") == "step" || !e.contains("args")) continue;
    const json& args = e["args"];
    const size_t rank = e.value("pid", ranks);
    const auto it = steps.find(args.value("step", -1));
    if (rank >= ranks || it == steps.end() || !args.contains("action")) usage_error(where, "an event outside any step: {}", e.dump());
    const double t0 = starts.at(it->first);
    TracedAction a{.action = traced_action(args["action"].get<std::string>(), where),
                   .start = (e["ts"].get<double>() - t0) / 1000,
                   .end = (e["ts"].get<double>() + e["dur"].get<double>() - t0) / 1000,
                   .planned_start = number_arg(args, "planned_start"),
                   .planned_end = number_arg(args, "planned_end"),
                   .taps = std::isfinite(number_arg(args, "kfac_taps_ms")) ? number_arg(args, "kfac_taps_ms") : 0.0};
    it->second.step_time = std::max(it->second.step_time, a.end);
    it->second.per_rank[rank].push_back(a);
  }
  std::vector<TracedStep> out;
  for (auto& [k, s] : steps) out.push_back(std::move(s));
  return out;
}

}  // namespace

TracedRun read_traced_run(const std::string& dir, const std::string& flag) {
  TracedRun run;
  run.dir = dir;
  const Profile prof = read_profile_json(dir + "/profile.json", flag);
  if (!prof.run) usage_error(flag, "'{}/profile.json' names no run (not written by --profile-dir)", dir);
  run.devices = std::max(1, prof.run->devices);
  const std::string path = dir + "/trace.json";
  try {
    run.steps = steps_of(parse_trace(path, flag)["traceEvents"], fmt::format("{} ({})", flag, path));
  } catch (const json::exception& e) {
    usage_error(flag, "'{}' is not a trace of --profile-dir: {}", path, e.what());
  }
  if (run.steps.empty()) usage_error(flag, "'{}' holds no profiled step", path);
  return run;
}

}  // namespace pf
