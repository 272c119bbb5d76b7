// `pipefisher plan`'s inputs (cmd_plan.hpp): the profile a flag names (a run's JSON, with the run's
// shape filling the flags not given, or the paper's CSV), or one built from the time flags; and
// --sweep, the paper's performance model over pipeline depths.
#include "cmd_plan.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "schedule/generators.hpp"
#include "sim/limits.hpp"
#include "sim/memory.hpp"
#include "sim/sweep.hpp"
#include "viz/sweep_chart.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace pf::app {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

// --profile DIR: the profile.json a run's --profile-dir (or a directory of the user's) holds.
static void resolve_profile_dir(PlanArgs& a) {
  std::error_code ec;
  if (a.profile.empty() || !std::filesystem::is_directory(a.profile, ec)) return;
  const std::string inside = (std::filesystem::path(a.profile) / "profile.json").string();
  if (!std::filesystem::exists(inside, ec))
    usage_error("--profile", "'{}' is a directory without profile.json (give a profile file: a run's "
                "--profile-dir holds profile.json)", a.profile);
  a.profile = inside;
}

// A JSON profile that names its run fills every shape flag not given.
void apply_profile_run(PlanArgs& a) {
  resolve_profile_dir(a);
  if (a.profile.empty() || !ends_with(a.profile, ".json") || a.sweep) return;
  const Profile p = read_profile_json(a.profile);
  if (!p.run) return;
  const ProfileRun& r = *p.run;
  auto fill = [&](const char* flag, auto& field, auto value) {
    if (a.given(flag)) return;
    field = value;
    a.from_profile.insert(flag);
  };
  if (a.schedule.empty() && a.schedule_file.empty()) {
    a.schedule = r.schedule;
    a.from_profile.insert("--schedule");
  }
  if (a.schedule == r.schedule && a.schedule_file.empty()) {  // the run's schedule: its shape too
    fill("--stages", a.stages, r.devices);
    fill("--micro-batches", a.micro_batches, r.micro_batches);
    if (r.schedule == "interleaved") fill("--virtual-stages", a.virtual_stages, r.virtual_stages);
  }
  fill("--data-parallel", a.data_parallel, r.replicas);
  if (!r.model.empty()) fill("--model", a.model, r.model);
  if (r.kfac != "off" && !a.no_kfac && !p.plan.kfac.empty()) a.kfac = true;
  if (r.recompute && !a.given("--recompute")) a.recompute = a.recompute_measured = true;
}

// Profiles to use: from --profile (all CSV rows in a sweep, else the row of --micro-batch-size),
// or one profile built from the time flags.
std::vector<Profile> load_profiles(const PlanArgs& a) {
  if (a.profile.empty()) {
    // --micro-batch-size and --layers-per-stage size the memory model (and --kfac's Linears).
    Profile p;
    p.micro_batch_size = a.micro_batch_size > 0 ? a.micro_batch_size : 1;
    StageCost& c = p.cost.stages[0];
    c.forward = a.tf;
    c.backward = a.tb;
    if (a.given("--tw")) {  // --tb is then I's time, and a backward without the split runs I + W
      c.input_grad = a.tb;
      c.weight_grad = a.tw;
      c.backward = a.tb + a.tw;
    }
    c.curvature = a.tcurv;
    c.inversion = a.tinv;
    c.precondition = a.tprec;
    p.cost.p2p_latency = a.tcomm;
    p.memory = {StageMemory{}};
    return {p};
  }
  for (const char* f : {"--tf", "--tb", "--tw", "--tcurv", "--tinv", "--tprec"})
    if (a.given(f)) usage_error(f, "durations come from --profile; give one or the other");
  if (ends_with(a.profile, ".json")) {
    if (a.given("--layers-per-stage") && !a.kfac) usage_error("--layers-per-stage", "only applies to the paper's CSV profile (the JSON profile is per stage)");
    Profile p = read_profile_json(a.profile);
    check_profile(p, "--profile");
    if (a.given("--micro-batch-size") && a.micro_batch_size != p.micro_batch_size)
      usage_error("--micro-batch-size", "{} but the profile was measured at micro-batch size {}", a.micro_batch_size,
                  p.micro_batch_size);
    if (a.given("--tcomm")) p.cost.p2p_latency = a.tcomm;
    return {p};
  }
  const int L = a.given("--layers-per-stage") ? a.layers_per_stage : 1;
  std::vector<ProfileRow> rows = read_paper_csv(a.profile);
  std::vector<Profile> out;
  for (const ProfileRow& r : rows)
    if (!a.given("--micro-batch-size") || r.bs == a.micro_batch_size) out.push_back(profile_from_row(r, L));
  std::string have;
  for (const ProfileRow& r : rows) have += (have.empty() ? "" : ", ") + std::to_string(r.bs);
  if (out.empty()) usage_error("--micro-batch-size", "no row with bs={} in '{}' (has {})", a.micro_batch_size, a.profile, have);
  if (out.size() > 1 && !a.sweep)
    usage_error("--micro-batch-size", "'{}' has rows for bs {}: pick one", a.profile, have);
  // The CSV gives the backward whole: zero-bubble schedules split it by --model's flops.
  const ModelConfig m = model_preset(a.model);
  const double w_share = weight_grad_share(m.hidden, m.ffn, kPaperProfileSeqLen);
  for (Profile& p : out) {
    p.cost.p2p_latency = a.tcomm;
    StageCost& c = p.cost.stages[0];
    c.weight_grad = w_share * c.backward;
    c.input_grad = c.backward - c.weight_grad;
  }
  for (const Profile& p : out) check_profile(p, "--profile");  // scaled by --layers-per-stage
  return out;
}

// The single profile of a schedule's simulation, with --recompute's extra forward in each backward.
Profile profile_of(const PlanArgs& a) {
  Profile p = load_profiles(a).front();
  if (a.recompute && !a.recompute_measured) add_recomputation(p.cost);
  return p;
}

int run_sweep_mode(const PlanArgs& a) {
  if (!a.schedule_file.empty()) usage_error("--sweep", "sweeps generated schedules, not --schedule-file");
  if (a.given("--csv-format")) usage_error("--csv-format", "is the schedule's form; --sweep's --csv is its table");
  if (a.given("--trace")) usage_error("--trace", "not available with --sweep");
  if (a.given("--stages") || a.given("--micro-batches"))
    usage_error(a.given("--stages") ? "--stages" : "--micro-batches", "--sweep chooses D and N itself (see --sweep-stages)");
  SweepSpec spec;
  spec.schedule = a.schedule.empty() ? "chimera" : a.schedule;
  const ScheduleName name = schedule_name(spec.schedule, "--schedule");  // an unknown name refused up front
  for (int d : a.sweep_stages) {
    // One stage has no bubbles: the ratio of K-FAC work to bubble time would be infinite.
    if (d < 2) usage_error("--sweep-stages", "depths must be >= 2 (a pipeline with bubbles), got {}", d);
    // The sweep's largest schedule: N = 3D micro-batches.
    check_schedule_size(d, schedule_size_bound(name, d, 3 * d, a.given("--virtual-stages") ? a.virtual_stages : 2),
                        false, "--sweep-stages");
  }
  spec.stages = a.sweep_stages;
  spec.recompute = a.recompute;
  spec.zb_memory = a.zb_memory;
  if (a.given("--virtual-stages")) spec.virtual_stages = a.virtual_stages;
  std::vector<SweepRow> rows = run_sweep(spec, load_profiles(a));
  if (rows.empty()) usage_error("--sweep-stages", "schedule {} is defined for none of the requested depths", spec.schedule);
  const char* durations = a.profile.empty() ? "--tf/--tb/--tcomm" : "--profile";
  for (const SweepRow& r : rows) {
    if (!(r.t_pipe > 0)) usage_error(durations, "the step takes 0 ms: no throughput to sweep (give the forward or backward a duration)");
    check_step_time(r.t_pipe + r.t_prec + r.t_curv_inv, durations);
  }
  std::string csv = sweep_csv(rows);
  if (!a.csv.empty()) write_output({a.csv, "--csv", true}, csv);
  if (!a.svg.empty())
    write_output({a.svg, "--svg", true}, sweep_svg(rows, fmt::format("Performance model: {}", spec.schedule)));
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const SweepRow& r : rows)
      j.push_back({{"schedule", r.schedule}, {"micro_batch_size", r.micro_batch_size}, {"stages", r.stages},
                   {"micro_batches", r.micro_batches}, {"t_pipe", r.t_pipe}, {"t_bubble", r.t_bubble},
                   {"t_prec", r.t_prec}, {"t_curv_inv", r.t_curv_inv}, {"ratio", r.ratio},
                   {"throughput_pipe", r.throughput_pipe}, {"throughput_pipefisher", r.throughput_pipefisher},
                   {"throughput_kfac", r.throughput_kfac}, {"throughput_kfac_skip", r.throughput_kfac_skip},
                   {"m_pipe", r.m_pipe}, {"m_kfac", r.m_kfac}, {"recompute", r.recompute}});
    fmt::print("{}\n", j.dump(1));
  } else {
    if (a.csv.empty()) fmt::print("{}", csv);
    print_outputs(a);
  }
  return 0;
}

}  // namespace pf::app
