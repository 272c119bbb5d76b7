// `pipefisher report --account`: the step account's tables and JSON (report_account.hpp).
#include "report_account.hpp"

#include "sim/step_account.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace pf::app {
namespace {

using nlohmann::json;

constexpr size_t kShownOverruns = 10;  // the text lists the largest overruns; --json has every unit

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(); }

std::string token(const TracedStep& s, int rank, int index) {
  return index < 0 ? std::string() : to_token(s.per_rank[rank][index].action);
}

// What an overrun delayed, by kind: "a pass", "a send", "the precondition", "the optimizer".
std::string delayed_what(Kind k) {
  if (is_pass(k)) return "a pass";
  if (k == Kind::SEND_F || k == Kind::SEND_B) return "a send";
  if (k == Kind::PREC) return "the precondition";
  if (k == Kind::OPT) return "the optimizer";
  return std::string(kind_name(k));
}

json path_json(const std::vector<PathSegment>& path, const TracedStep& s) {
  json out = json::array();
  for (const PathSegment& p : path)
    out.push_back({{"rank", p.rank}, {"index", p.index < 0 ? json() : json(p.index)},
                   {"action", p.index < 0 ? json() : json(token(s, p.rank, p.index))},
                   {"start_ms", p.start}, {"end_ms", p.end}, {"part", part_name(p.part)}});
  return out;
}

json unit_json(const UnitAccount& u, const TracedStep& s) {
  const Kind delayed = u.delayed >= 0 ? s.per_rank[u.rank][u.delayed].action.kind : Kind::F;
  return {{"rank", u.rank},
          {"index", u.index},
          {"action", token(s, u.rank, u.index)},
          {"planned_ms", number_or_null(u.planned)},
          {"measured_ms", u.measured},
          {"end_ms", u.end},
          {"bubble_end_ms", u.bubble.time},
          {"bubble_end_set_by", u.bubble.index < 0 ? json() : json({{"rank", u.bubble.rank},
                                                                     {"action", token(s, u.bubble.rank, u.bubble.index)}})},
          {"overrun_ms", u.overrun},
          {"delayed", u.delayed < 0 ? json() : json(token(s, u.rank, u.delayed))},
          {"delayed_what", u.delayed < 0 ? json() : json(delayed_what(delayed))}};
}

// Each PREC with its time on the critical path.
json preconditions_json(const StepAccount& a, const TracedStep& s) {
  json out = json::array();
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r)
    for (int i = 0; i < static_cast<int>(s.per_rank[r].size()); ++i) {
      if (s.per_rank[r][i].action.kind != Kind::PREC) continue;
      double on_path = 0;
      for (const PathSegment& p : a.path) on_path += p.rank == r && p.index == i ? p.end - p.start : 0;
      out.push_back({{"rank", r}, {"action", token(s, r, i)}, {"measured_ms", s.per_rank[r][i].duration()},
                     {"planned_ms", number_or_null(s.per_rank[r][i].planned_end - s.per_rank[r][i].planned_start)},
                     {"on_critical_path_ms", on_path}});
    }
  return out;
}

json parts_json(const std::array<double, kNumParts>& pf, const std::array<double, kNumParts>& base) {
  json out = json::array();
  for (int p = 0; p < kNumParts; ++p)
    out.push_back({{"part", part_name(static_cast<Part>(p))}, {"pipefisher_ms", pf[p]}, {"baseline_ms", base[p]},
                   {"difference_ms", pf[p] - base[p]}});
  return out;
}

json step_json(const StepAccount& a, const TracedStep& s, const TracedStep& base) {
  json passes = json::array(), units = json::array();
  for (const RankPasses& p : a.passes) {
    json settings = json::array();
    for (int k = 0; k < kNumPassSettings; ++k)
      settings.push_back({{"setting", pass_setting_name(static_cast<PassSetting>(k))}, {"passes", p.by_setting[k].count},
                          {"ms", p.by_setting[k].ms}, {"baseline_ms", p.by_setting[k].base_ms}});
    passes.push_back({{"rank", p.rank}, {"forward_ms", p.forward}, {"baseline_forward_ms", p.base_forward},
                      {"backward_ms", p.backward}, {"baseline_backward_ms", p.base_backward}, {"taps_ms", p.taps},
                      {"baseline_taps_ms", p.base_taps}, {"by_setting", settings}});
  }
  for (const UnitAccount& u : a.units) units.push_back(unit_json(u, s));
  return {{"step", a.step}, {"baseline_step", a.base_step}, {"step_ms", a.step_time},
          {"baseline_step_ms", a.base_step_time}, {"difference_ms", a.difference()},
          {"parts", parts_json(a.parts, a.base_parts)}, {"passes", passes}, {"units", units},
          {"preconditions", preconditions_json(a, s)}, {"critical_path", path_json(a.path, s)},
          {"baseline_critical_path", path_json(a.base_path, base)}};
}

const TracedStep& step_of(const TracedRun& run, int number) {
  return *std::find_if(run.steps.begin(), run.steps.end(), [&](const TracedStep& s) { return s.step == number; });
}

void print_parts(const std::array<double, kNumParts>& pf, const std::array<double, kNumParts>& base, double pf_step,
                 double base_step) {
  fmt::print("  {:<32} {:>11} {:>11} {:>11}\n", "on the critical path (ms)", "PipeFisher", "NVLAMB", "difference");
  for (int p = 0; p < kNumParts; ++p)
    fmt::print("  {:<32} {:>11.2f} {:>11.2f} {:>+11.2f}\n", part_name(static_cast<Part>(p)), pf[p], base[p], pf[p] - base[p]);
  fmt::print("  {:<32} {:>11.2f} {:>11.2f} {:>+11.2f}\n", "step (the sum)", pf_step, base_step, pf_step - base_step);
}

void print_units(const StepAccount& a, const TracedStep& s) {
  for (int r = 0; r < static_cast<int>(s.per_rank.size()); ++r) {
    int n = 0, over = 0;
    double planned = 0, measured = 0, overrun = 0;
    for (const UnitAccount& u : a.units) {
      if (u.rank != r) continue;
      ++n;
      planned += std::isfinite(u.planned) ? u.planned : 0;
      measured += u.measured;
      over += u.overrun > 0;
      overrun += u.overrun;
    }
    if (n > 0)
      fmt::print("  rank {} K-FAC units: {} ran, planned {:.2f} ms, measured {:.2f} ms; {} overran their bubbles, by "
                 "{:.2f} ms in all\n", r, n, planned, measured, over, overrun);
  }
  std::vector<const UnitAccount*> over;
  for (const UnitAccount& u : a.units)
    if (u.overrun > 0) over.push_back(&u);
  std::stable_sort(over.begin(), over.end(), [](auto* x, auto* y) { return x->overrun > y->overrun; });
  if (over.empty()) return;
  fmt::print("  {:>4} {:<14} {:>8} {:>9} {:>9} {:>11} {:>8}  {}\n", "rank", "unit", "planned", "measured", "end",
             "bubble end", "overrun", "delayed");
  for (size_t k = 0; k < over.size() && k < kShownOverruns; ++k) {
    const UnitAccount& u = *over[k];
    const std::string delayed = u.delayed < 0 ? "-" : fmt::format("{} ({})", token(s, u.rank, u.delayed),
                                                                    delayed_what(s.per_rank[u.rank][u.delayed].action.kind));
    fmt::print("  {:>4} {:<14} {:>8} {:>9.2f} {:>9.2f} {:>11.2f} {:>8.2f}  {}\n", u.rank, token(s, u.rank, u.index),
               std::isfinite(u.planned) ? fmt::format("{:.2f}", u.planned) : "-", u.measured, u.end, u.bubble.time,
               u.overrun, delayed);
  }
  if (over.size() > kShownOverruns) fmt::print("  ... {} more (--json lists every unit)\n", over.size() - kShownOverruns);
}

// Each rank's passes by setting against NVLAMB's same passes, without their taps (of one step, or
// summed over steps).
void print_pass_settings(const std::vector<RankPasses>& passes) {
  for (const RankPasses& p : passes) {
    fmt::print("  rank {} passes against NVLAMB's same passes:", p.rank);
    for (int k = 0; k < kNumPassSettings; ++k) {
      const PassGroup& g = p.by_setting[k];
      fmt::print("{} {} {}: {:+.2f} ms", k ? ";" : "", g.count, pass_setting_name(static_cast<PassSetting>(k)), g.ms - g.base_ms);
      if (g.base_ms > 0) fmt::print(" ({:+.1f}%)", 100 * (g.ms / g.base_ms - 1));
    }
    fmt::print("\n");
  }
}

// Every step's pass groups added up, per rank.
std::vector<RankPasses> summed_passes(const std::vector<StepAccount>& accounts) {
  std::vector<RankPasses> sum = accounts.front().passes;
  for (size_t i = 1; i < accounts.size(); ++i)
    for (size_t r = 0; r < sum.size() && r < accounts[i].passes.size(); ++r)
      for (int k = 0; k < kNumPassSettings; ++k) {
        PassGroup &to = sum[r].by_setting[k];
        const PassGroup& g = accounts[i].passes[r].by_setting[k];
        to.count += g.count, to.ms += g.ms, to.base_ms += g.base_ms;
      }
  return sum;
}

void print_step(const StepAccount& a, const TracedStep& s) {
  fmt::print("step {}: PipeFisher {:.2f} ms, NVLAMB {:.2f} ms (its step {}), difference {:+.2f} ms\n", a.step, a.step_time,
             a.base_step_time, a.base_step, a.difference());
  print_parts(a.parts, a.base_parts, a.step_time, a.base_step_time);
  for (const RankPasses& p : a.passes)
    fmt::print("  rank {} passes without taps: forward {:.2f} ms (NVLAMB {:.2f}, {:+.2f}), backward {:.2f} ms (NVLAMB "
               "{:.2f}, {:+.2f}); K-FAC taps {:.2f} ms (NVLAMB {:.2f})\n",
               p.rank, p.forward, p.base_forward, p.forward - p.base_forward, p.backward, p.base_backward,
               p.backward - p.base_backward, p.taps, p.base_taps);
  print_pass_settings(a.passes);
  for (const json& p : preconditions_json(a, s))
    fmt::print("  precondition {} on rank {}: {:.2f} ms, {:.2f} ms of it on the critical path\n",
               p["action"].get<std::string>(), p["rank"].get<int>(), p["measured_ms"].get<double>(),
               p["on_critical_path_ms"].get<double>());
  print_units(a, s);
}

}  // namespace

int run_step_account(const std::string& profile_dir, const std::string& baseline_dir, bool as_json) {
  const TracedRun run = read_traced_run(profile_dir, "--account"), base = read_traced_run(baseline_dir, "--baseline");
  const std::vector<StepAccount> accounts = account_run(run, base, "--account");
  std::array<double, kNumParts> mean{}, base_mean{};
  double step = 0, base_step = 0;
  const double n = static_cast<double>(accounts.size());
  for (const StepAccount& a : accounts) {
    for (int p = 0; p < kNumParts; ++p) mean[p] += a.parts[p] / n, base_mean[p] += a.base_parts[p] / n;
    step += a.step_time / n, base_step += a.base_step_time / n;
  }
  if (as_json) {
    json steps = json::array();
    for (const StepAccount& a : accounts) steps.push_back(step_json(a, step_of(run, a.step), step_of(base, a.base_step)));
    const json j = {{"run", profile_dir}, {"baseline", baseline_dir}, {"steps", steps},
                    {"mean", {{"steps", accounts.size()}, {"step_ms", step}, {"baseline_step_ms", base_step},
                              {"difference_ms", step - base_step}, {"parts", parts_json(mean, base_mean)}}}};
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  fmt::print("account: {} against the baseline {}, {} steps profiled in both\n", profile_dir, baseline_dir,
             accounts.size());
  for (const StepAccount& a : accounts) print_step(a, step_of(run, a.step));
  fmt::print("mean over the {} steps: PipeFisher {:.2f} ms, NVLAMB {:.2f} ms, difference {:+.2f} ms ({:.3f}x)\n",
             accounts.size(), step, base_step, step - base_step, base_step > 0 ? step / base_step : 0.0);
  print_parts(mean, base_mean, step, base_step);
  fmt::print("  the passes of the {} steps, by setting:\n", accounts.size());
  print_pass_settings(summed_passes(accounts));
  return 0;
}

}  // namespace pf::app
