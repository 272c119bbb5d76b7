// `pipefisher plan`'s flags parsed once into a PlanRequest (cmd_plan.hpp): the profile a flag names
// (a run's JSON, with the run's shape filling the flags not given, or the paper's CSV) or one built
// from the time flags, the schedule asked for, and the flags that apply only with others.
#include "cmd_plan.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "sim/limits.hpp"
#include "sim/memory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>

namespace pf::app {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// --profile DIR: the profile.json a run's --profile-dir (or a directory of the user's) holds.
void resolve_profile_dir(PlanFlags& a) {
  std::error_code ec;
  if (a.profile.empty() || !std::filesystem::is_directory(a.profile, ec)) return;
  const std::string inside = (std::filesystem::path(a.profile) / "profile.json").string();
  if (!std::filesystem::exists(inside, ec))
    usage_error("--profile", "'{}' is a directory without profile.json (give a profile file: a run's "
                "--profile-dir holds profile.json)", a.profile);
  a.profile = inside;
}

// What a run's profile filled in.
struct ProfileFill {
  std::set<std::string> flags;      // the flags whose value came from it
  bool recompute_measured = false;  // its backward times already include recomputation
};

// A JSON profile that names its run fills every shape flag not given.
ProfileFill apply_profile_run(PlanFlags& a) {
  ProfileFill filled;
  resolve_profile_dir(a);
  if (a.profile.empty() || !ends_with(a.profile, ".json") || a.sweep) return filled;
  const Profile p = read_profile_json(a.profile);
  if (!p.run) return filled;
  const ProfileRun& r = *p.run;
  auto fill = [&](const char* flag, auto& field, auto value) {
    if (a.given(flag)) return;
    field = value;
    filled.flags.insert(flag);
  };
  if (a.schedule.empty() && a.schedule_file.empty()) {
    a.schedule = r.schedule;
    filled.flags.insert("--schedule");
  }
  if (a.schedule == r.schedule && a.schedule_file.empty()) {  // the run's schedule: its shape too
    fill("--stages", a.stages, r.devices);
    fill("--micro-batches", a.micro_batches, r.micro_batches);
    if (r.schedule == "interleaved") fill("--virtual-stages", a.virtual_stages, r.virtual_stages);
  }
  fill("--data-parallel", a.data_parallel, r.replicas);
  if (!r.model.empty()) fill("--model", a.model, r.model);
  if (r.kfac != "off" && !a.no_kfac && !p.plan.kfac.empty()) a.kfac = true;
  if (r.recompute && !a.given("--recompute")) a.recompute = filled.recompute_measured = true;
  return filled;
}

// The schedule asked for: a file, or a name (required with its D and N, given or filled), or
// with --sweep a name alone (Chimera by default).
ScheduleRequest schedule_request(const PlanFlags& a, const ProfileFill& filled) {
  auto has = [&](const char* flag) { return a.given(flag) || filled.flags.count(flag) > 0; };
  ScheduleRequest s;
  s.zb_memory = a.zb_memory;
  if (has("--virtual-stages")) s.virtual_stages = a.virtual_stages;
  if (a.sweep) {
    if (!a.schedule_file.empty()) usage_error("--sweep", "sweeps generated schedules, not --schedule-file");
    if (a.given("--stages") || a.given("--micro-batches"))
      usage_error(a.given("--stages") ? "--stages" : "--micro-batches", "--sweep chooses D and N itself (see --sweep-stages)");
    s.name = schedule_name(a.schedule.empty() ? "chimera" : a.schedule, "--schedule");
    return s;
  }
  if (a.schedule.empty() == a.schedule_file.empty())
    usage_error("--schedule", "give either --schedule NAME or --schedule-file FILE");
  if (!a.schedule_file.empty()) {
    for (const char* f : {"--stages", "--micro-batches"})
      if (a.given(f)) usage_error(f, "comes from --schedule-file");
    s.file = a.schedule_file;
    return s;
  }
  if (!has("--stages")) usage_error("--stages", "required with --schedule");
  if (!has("--micro-batches")) usage_error("--micro-batches", "required with --schedule");
  s.stages = a.stages;
  s.micro_batches = a.micro_batches;
  s.name = schedule_name(a.schedule, "--schedule");
  return s;
}

// More steps than this in one picture are unreadable (and each costs a copy of the step's actions).
constexpr int kMaxSvgSteps = 32;

// Flags that apply only with others, and outputs that would overwrite an input.
void check_flag_combinations(const PlanFlags& a, const ScheduleRequest& s) {
  if (!a.kfac)
    for (const char* f : {"--margin", "--split-to-shorten", "--min-refresh-steps", "--no-stage-group", "--bcast-alpha", "--bcast-beta"})
      if (a.given(f)) usage_error(f, "only applies with --kfac");
  if (a.kfac && a.sweep) usage_error("--kfac", "not available with --sweep");
  if (a.data_parallel > kMaxDevices)
    usage_error("--data-parallel", "{} replicas, more than the {} the planner takes (sim/limits.hpp)", a.data_parallel,
                kMaxDevices);
  if (a.given("--virtual-stages") && s.name != ScheduleName::Interleaved)
    usage_error("--virtual-stages", "only applies to --schedule interleaved");
  if (a.given("--zb-memory") && s.name != ScheduleName::ZbAuto) usage_error("--zb-memory", "only applies to --schedule zb-auto");
  if (a.given("--sweep-stages") && !a.sweep) usage_error("--sweep-stages", "only applies with --sweep");
  if (a.given("--partition")) {
    if (a.given("--layers-per-stage")) usage_error("--partition", "gives each stage's blocks; --layers-per-stage gives all the same: give one");
    if (a.sweep) usage_error("--partition", "not available with --sweep");
    if (a.profile.empty() || ends_with(a.profile, ".json"))
      usage_error("--partition", "scales the paper's per-block CSV profile (--profile FILE.csv); a run's profile and "
                  "the time flags are per stage");
  }
  if (a.sweep && a.given("--csv-format")) usage_error("--csv-format", "is the schedule's form; --sweep's --csv is its table");
  if (a.sweep && a.given("--trace")) usage_error("--trace", "not available with --sweep");
  for (const char* f : {"--steps", "--width"})
    if (a.given(f) && (a.svg.empty() || a.sweep)) usage_error(f, "only applies to a timeline's --svg");
  if (a.given("--width") && (a.svg_width < 200 || a.svg_width > 16000))
    usage_error("--width", "must be 200 to 16000 px, got {}", a.svg_width);
  if (a.given("--steps") && a.svg_steps > kMaxSvgSteps)
    usage_error("--steps", "at most {} steps in one picture, got {}", kMaxSvgSteps, a.svg_steps);
  check_outputs({{a.csv, "--csv", true}, {a.svg, "--svg", true}, {a.trace, "--trace", true}},
                {{a.profile, "--profile"}, {a.schedule_file, "--schedule-file"}});
}

// One profile from the time flags; --micro-batch-size sizes the memory model (and --kfac's Linears).
Profile flag_profile(const PlanFlags& a) {
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
  return p;
}

// The paper's CSV: the row of --micro-batch-size (every row in a sweep), scaled by --layers-per-stage;
// the backward split into I and W by --model's flops for zero-bubble schedules.
std::vector<Profile> csv_profiles(const PlanFlags& a) {
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

// Profiles to use: from --profile (a run's JSON, or the paper's CSV), or one built from the time flags.
std::vector<Profile> load_profiles(const PlanFlags& a) {
  if (a.profile.empty()) return {flag_profile(a)};
  for (const char* f : {"--tf", "--tb", "--tw", "--tcurv", "--tinv", "--tprec"})
    if (a.given(f)) usage_error(f, "durations come from --profile; give one or the other");
  if (!ends_with(a.profile, ".json")) return csv_profiles(a);
  if (a.given("--layers-per-stage") && !a.kfac)
    usage_error("--layers-per-stage", "only applies to the paper's CSV profile (the JSON profile is per stage)");
  Profile p = read_profile_json(a.profile);
  check_profile(p, "--profile");
  if (a.given("--micro-batch-size") && a.micro_batch_size != p.micro_batch_size)
    usage_error("--micro-batch-size", "{} but the profile was measured at micro-batch size {}", a.micro_batch_size,
                p.micro_batch_size);
  if (a.given("--tcomm")) p.cost.p2p_latency = a.tcomm;
  return {p};
}

PlanOutputs outputs_of(const PlanFlags& a) {
  return {.svg = a.svg, .trace = a.trace, .csv = a.csv,
          .csv_format = a.csv_format == "torch" ? CsvFormat::torch : CsvFormat::pipefisher,
          .json = a.json, .svg_steps = a.svg_steps, .svg_width = a.svg_width};
}

KfacOptions kfac_options_of(const PlanFlags& a) {
  KfacOptions k;
  k.margin = a.margin;
  k.split_to_shorten = a.split_to_shorten;
  k.min_refresh_steps = a.min_refresh_steps;
  k.stage_group = !a.no_stage_group;
  if (a.given("--bcast-alpha")) k.bcast_alpha = a.bcast_alpha;
  if (a.given("--bcast-beta")) k.bcast_beta = a.bcast_beta;
  return k;
}

}  // namespace

PlanRequest request_of(PlanFlags& a) {
  const ProfileFill filled = apply_profile_run(a);
  PlanRequest r;
  r.mode = a.sweep ? PlanMode::sweep : a.kfac ? PlanMode::kfac : PlanMode::simulate;
  r.schedule = schedule_request(a, filled);
  check_flag_combinations(a, r.schedule);
  r.flag_durations = a.profile.empty();
  r.unit_durations = a.profile.empty() && !a.given("--tf") && !a.given("--tb");
  r.recompute = a.recompute;
  r.model = a.model;
  r.seq_len = a.seq_len;
  r.model_named = a.given("--model") || filled.flags.count("--model") > 0;
  if (a.given("--layers-per-stage")) r.layers_per_stage = a.layers_per_stage;
  r.partition = a.partition;
  r.data_parallel = a.data_parallel;
  r.kfac = kfac_options_of(a);
  r.sweep_stages = a.sweep_stages;
  r.out = outputs_of(a);
  r.from_profile.assign(filled.flags.begin(), filled.flags.end());
  if (r.mode == PlanMode::sweep) {
    r.sweep_profiles = load_profiles(a);
  } else {
    r.profile = load_profiles(a).front();
    if (r.recompute && !filled.recompute_measured) add_recomputation(r.profile.cost);
  }
  return r;
}

std::vector<std::string> PlanRequest::warnings() const {
  std::vector<std::string> w;
  if (unit_durations)
    w.push_back("no durations given (--profile, or --tf and --tb): every forward takes 1 and every backward 2, "
                "and the times below are in those units");
  if (kfac_mode()) {
    bool costs = !profile.plan.kfac.empty();
    for (const StageCost& c : profile.cost.stages) costs = costs || c.curvature > 0 || c.inversion > 0 || c.precondition > 0;
    if (!costs)
      w.push_back("no K-FAC costs given (--profile with them, or --tcurv, --tinv and --tprec): K-FAC's units are "
                  "planned at zero cost, and the plan shows only their order");
  }
  return w;
}

// The files --svg, --trace and --csv wrote (text mode: the JSON's reader named them).
void print_outputs(const PlanOutputs& out) {
  std::vector<std::string> written;
  for (const std::string* path : {&out.svg, &out.trace, &out.csv})
    if (!path->empty()) written.push_back(*path);
  if (!written.empty()) fmt::print("outputs: {}\n", fmt::join(written, ", "));
}

}  // namespace pf::app
