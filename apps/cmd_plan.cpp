// pipefisher plan: generate (or read) a pipeline schedule, validate it, simulate one step with
// given or profiled durations, and report step time, bubbles, utilization, memory; optionally
// draw it (SVG), trace it (Chrome JSON), save it (CSV), or sweep the paper's performance model.
//   pipefisher plan --schedule 1f1b --stages 4 --micro-batches 8 --tf 1 --tb 2 --svg t.svg
//   pipefisher plan --schedule chimera --stages 8 --micro-batches 8 --profile bert_base.csv
//                   --micro-batch-size 32 --layers-per-stage 3 --json
//   pipefisher plan --schedule-file mine.csv --trace t.json
//   pipefisher plan --sweep --schedule chimera --profile bert_base.csv --csv sweep.csv --svg sweep.svg
//   pipefisher plan --kfac --schedule 1f1b --stages 8 --micro-batches 8 --tf 31.17 --tb 48.84
//                   --tcurv 82.35 --tinv 242.55 --tprec 26.7 --model bert-large --layers-per-stage 3
//     PipeFisher: K-FAC work placed into the bubbles (sim/planner.hpp); costs per stage per
//     micro-batch, split per factor by the preset's Linear shapes (d^2 curvature, d^3 inversion)
//     over --layers-per-stage blocks (default 1; with the paper's CSV it also scales the costs).
//     --data-parallel W > 1: inversions placed over the replicas by SPD-KFAC's Algorithm 1 with
//     broadcasts of --bcast-alpha + --bcast-beta * bytes (JSON `kfac.placement`).
//   pipefisher plan --profile RUN/profile/profile.json
//     A profile a run wrote carries its shape (schedule, D, N, W, V, model, K-FAC placement) and
//     its K-FAC units per layer: with no other flag, plan predicts that run; flags override.
// --data-parallel W without --kfac adds the gradient all-reduce of every hosted stage at the end.
// The memory model: the profile's, else estimated from --model's shapes (sim/memory.hpp).
// Times are in milliseconds (flags and profiles alike).
#include "command.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "nn/names.hpp"
#include "schedule/generators.hpp"
#include "schedule/validate.hpp"
#include "sim/limits.hpp"
#include "sim/memory.hpp"
#include "sim/planner.hpp"
#include "sim/profile.hpp"
#include "sim/sim.hpp"
#include "sim/sweep.hpp"
#include "viz/render.hpp"
#include "viz/sweep_chart.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>

namespace pf::app {
namespace {

struct PlanArgs {
  std::string schedule, schedule_file, profile, svg, trace, csv, model = "bert-base";
  int stages = 0, micro_batches = 0, virtual_stages = 0, micro_batch_size = 0, layers_per_stage = 0;
  double tf = 1, tb = 2, tcomm = 0, tcurv = 0, tinv = 0, tprec = 0;
  bool json = false, sweep = false, kfac = false, no_kfac = false, split_to_shorten = false, no_stage_group = false, recompute = false;
  int data_parallel = 1;
  double margin = 0.05;
  double bcast_alpha = -1, bcast_beta = -1;  // < 0: the profile's all-reduce alpha / beta
  std::vector<int> sweep_stages = {4, 8, 16, 32};
  CLI::App* app = nullptr;
  std::set<std::string> from_profile;  // flags whose value came from the profile's run
  bool recompute_measured = false;     // the profile's backward times already include R
  bool given(const char* flag) const { return app->count(flag) > 0; }
  bool has(const char* flag) const { return given(flag) || from_profile.count(flag) > 0; }
};

bool ends_with(const std::string& s, const std::string& suffix);

// A JSON profile that names its run fills every shape flag not given.
void apply_profile_run(PlanArgs& a) {
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
  if (r.kfac != "off" && !a.no_kfac && !p.kfac.empty()) a.kfac = true;
  if (r.recompute && !a.given("--recompute")) a.recompute = a.recompute_measured = true;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig m;
  try {
    apply_model_preset(m, name);
  } catch (const UsageError&) {
    std::string names;
    for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
    usage_error("--model", "unknown preset '{}' (expected one of {})", name, names);
  }
  return m;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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
    c.curvature = a.tcurv;
    c.inversion = a.tinv;
    c.precondition = a.tprec;
    p.cost.p2p_latency = a.tcomm;
    p.memory = {StageMemory{}};
    return {p};
  }
  for (const char* f : {"--tf", "--tb", "--tcurv", "--tinv", "--tprec"})
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
  for (Profile& p : out) p.cost.p2p_latency = a.tcomm;
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
  if (a.given("--trace")) usage_error("--trace", "not available with --sweep");
  if (a.given("--stages") || a.given("--micro-batches"))
    usage_error(a.given("--stages") ? "--stages" : "--micro-batches", "--sweep chooses D and N itself (see --sweep-stages)");
  SweepSpec spec;
  spec.schedule = a.schedule.empty() ? "chimera" : a.schedule;
  make_schedule(spec.schedule, 2, 2, 2);  // refuse an unknown name up front
  for (int d : a.sweep_stages) {
    // One stage has no bubbles: the ratio of K-FAC work to bubble time would be infinite.
    if (d < 2) usage_error("--sweep-stages", "depths must be >= 2 (a pipeline with bubbles), got {}", d);
    // The sweep's largest schedule: N = 3D micro-batches.
    check_schedule_size(d, int64_t{6} * d * 3 * d * (a.given("--virtual-stages") ? a.virtual_stages : 2), false,
                        "--sweep-stages");
  }
  spec.stages = a.sweep_stages;
  spec.recompute = a.recompute;
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
  } else if (a.csv.empty()) {
    fmt::print("{}", csv);
  }
  return 0;
}


// --kfac: plan PipeFisher on the simulated step and report it (JSON `kfac`, summary, drawings).
nlohmann::json run_kfac(const PlanArgs& a, const Schedule& s, const Profile& prof, const std::string& title,
                        double base_bubble) {
  // Units measured per layer (a run's profile) need no model shapes to split stage costs.
  const bool measured = !prof.kfac.empty() && !a.given("--layers-per-stage");
  const ModelConfig m = measured && !a.has("--model") ? ModelConfig{} : model_preset(a.model);
  const std::string model_name = measured && !a.has("--model") ? std::string("measured") : a.model;
  const int blocks = a.given("--layers-per-stage") ? a.layers_per_stage : 1;
  // K-FAC units per step: per device, per Linear of its blocks, curvature per micro-batch (A and
  // B), two inversions and a precondition, on top of the schedule's own actions.
  int64_t linears = int64_t{blocks} * static_cast<int64_t>(block_linears(name_of(m.arch), m.hidden, m.ffn).size());
  for (const StageKfacCost& k : prof.kfac) linears = std::max<int64_t>(linears, k.layers());
  check_schedule_size(s.devices,
                      static_cast<int64_t>(s.num_actions()) + int64_t{s.devices} * linears * (2 * s.micro_batches + 3),
                      true, a.given("--layers-per-stage") ? "--layers-per-stage" : "--micro-batches");
  std::vector<LinearShape> layers;
  for (int b = 0; b < blocks; ++b)
    for (const LinearShape& l : block_linears(name_of(m.arch), m.hidden, m.ffn)) layers.push_back(l);
  PlanInput in;
  in.schedule = s;
  in.cost = prof.cost;
  in.replicas = a.data_parallel;
  in.margin = a.margin;
  in.split_to_shorten = a.split_to_shorten;
  in.chimera_group = !a.no_stage_group;
  in.recompute = a.recompute;
  // Broadcast of an inverse among the replicas (Algorithm 1's t_comm): the flags, else the
  // profile's all-reduce fit (the same bytes over the same links; 0 without one: all CT).
  // A run's profile carries the broadcast model its plan used.
  in.bcast_alpha = a.bcast_alpha >= 0 ? a.bcast_alpha : prof.bcast_alpha >= 0 ? prof.bcast_alpha : prof.cost.allreduce_alpha;
  in.bcast_beta = a.bcast_beta >= 0 ? a.bcast_beta : prof.bcast_beta >= 0 ? prof.bcast_beta : prof.cost.allreduce_beta;
  if (measured) {
    in.kfac = prof.kfac;  // measured per layer by the run that wrote the profile
    for (StageKfacCost& k : in.kfac) k.sync = std::max(k.sync, 1e-3);  // as the runtime: never a zero-length sync
  }
  for (const StageCost& c : prof.cost.stages) {
    if (measured) break;
    // Curvature sync: all-reduce of the stage's factors (the inverses travel in their own
    // BCAST_INV units), 4-byte floats; alpha + beta * bytes from the profile (0 without one).
    double floats = 0;
    for (const LinearShape& l : layers) floats += double(l.d_in) * l.d_in + double(l.d_out) * l.d_out;
    double bytes = c.curvature_bytes > 0 ? c.curvature_bytes : 4 * floats;
    in.kfac.push_back(split_stage_cost(layers, c.curvature, c.inversion, c.precondition,
                                       prof.cost.allreduce_alpha + prof.cost.allreduce_beta * bytes));
  }
  KfacPlan p = plan_kfac(in);
  for (double t : {p.step_time, p.base_step_time, p.inline_time}) check_step_time(t, "--kfac");
  const int P = p.period();
  std::vector<double> starts;
  Timeline tl = p.period_timeline(0, P, &starts);
  const std::string kt = fmt::format("{} + PipeFisher ({} steps{})", title, P,
                                     a.data_parallel > 1 ? fmt::format(", replica 0 of {}", a.data_parallel) : "");
  if (!a.svg.empty()) {
    SvgOptions o;
    o.title = kt;
    o.step_starts = starts;
    // The numbers of the text and JSON reports (a refresh period is several steps).
    o.summary = fmt::format("refresh period {} steps, step {:.2f} ms, utilization {:.1f}%, bubble {:.2f} ms per "
                            "device per step before K-FAC", P, p.step_time, 100 * p.utilization, base_bubble);
    write_output({a.svg, "--svg", true}, timeline_svg(tl, o));
  }
  if (!a.trace.empty()) {
    // K-FAC units named by their layer: the profile's names, else the model's for uniform stages of
    // `blocks` blocks (stage s holds blocks s*blocks ..).
    LayerNames names;
    for (int st = 0; st < s.stages; ++st)
      for (int pl = 0; pl < s.pipelines; ++pl) {
        if (measured && st < static_cast<int>(prof.layer_names.size())) {
          for (size_t l = 0; l < prof.layer_names[st].size(); ++l)
            if (!prof.layer_names[st][l].empty()) names[{pl, st, static_cast<int>(l)}] = prof.layer_names[st][l];
          continue;
        }
        int l = 0;
        for (int b = 0; b < blocks; ++b)
          for (const std::string& n : block_linear_names(m.arch, st * blocks + b)) names[{pl, st, l++}] = n;
      }
    write_output({a.trace, "--trace", true},
                 chrome_trace({TraceStep{.step = 1, .start = 0, .timeline = &tl}}, kt, names));
  }

  nlohmann::json lb = nlohmann::json::array(), per = nlohmann::json::array(), splits = nlohmann::json::array();
  for (int d = 0; d < s.devices; ++d) {
    lb.push_back(p.lower_bound_refresh_steps[d] < 0 ? nlohmann::json(nullptr) : nlohmann::json(p.lower_bound_refresh_steps[d]));
    per.push_back({{"device", d}, {"refresh_steps", p.refresh_steps[d]}, {"lower_bound_refresh_steps", lb.back()},
                   {"bubble", p.bubble[d]}, {"kfac_work", p.kfac_work[d]}, {"inline_work", p.device_inline[d]},
                   {"precondition", p.precondition[d]},
                   {"utilization", p.utilization_per_device[d]}, {"strategy", p.strategy[d]}});
  }
  // W > 1: Algorithm 1 per stage (which pieces are broadcast, by whom, the modelled loads).
  nlohmann::json placement = nlohmann::json::array();
  for (const StagePlacement& sp : p.placements) {
    nlohmann::json pieces = nlohmann::json::array();
    for (int k : sp.placement.order) {
      const int o = sp.placement.owner[k];
      pieces.push_back({{"piece", to_token(sp.pieces[k])}, {"dim", sp.dims[k]}, {"inversion", sp.inv_time[k]},
                        {"broadcast", sp.bcast_time[k]}, {"communicated", o != kEveryRank},
                        {"owner", o == kEveryRank ? nlohmann::json("every") : nlohmann::json(o)}});
    }
    nlohmann::json members = nlohmann::json::array();  // owner m is members[m]: {device, replica}
    for (auto [dev, rep] : sp.members) members.push_back({{"device", dev}, {"replica", rep}});
    placement.push_back({{"pipeline", sp.pipeline}, {"stage", sp.stage}, {"device", sp.device}, {"members", members},
                         {"communicated", sp.placement.communicated()},
                         {"non_communicated", static_cast<int>(sp.pieces.size()) - sp.placement.communicated()},
                         {"load", sp.placement.load}, {"makespan", sp.placement.makespan()}, {"pieces", pieces}});
  }
  for (const FactorSplit& f : p.splits)
    splits.push_back({{"pipeline", f.pipeline}, {"stage", f.stage}, {"layer", f.layer},
                      {"factor", f.kind == Kind::INV_A ? "A" : "B"}, {"blocks", f.blocks}, {"whole", f.whole},
                      {"pieces", f.pieces}});
  return {{"refresh_steps", p.refresh_steps}, {"lower_bound_refresh_steps", lb}, {"utilization", p.utilization},
          {"step_time", p.step_time}, {"base_step_time", p.base_step_time}, {"inline_time", p.inline_time},
          {"period", P}, {"common_cycle", p.common_cycle}, {"sync_steps", p.sync_steps}, {"data_parallel", a.data_parallel}, {"margin", a.margin},
          {"model", model_name}, {"layers_per_stage", blocks}, {"splits", splits}, {"per_device", per},
          {"bcast_alpha", in.bcast_alpha}, {"bcast_beta", in.bcast_beta}, {"placement", placement},
          {"plain_step_time", p.plain_step_time}, {"precondition_share", p.precondition_share()},
          {"precondition_line", p.precondition_line()}, {"timeline_text", timeline_text(tl)}};
}

void print_kfac(const nlohmann::json& k) {
  fmt::print("PipeFisher ({} model shapes, margin {:g}, W={}): refresh steps per device {} (lower bound {}), "
             "step time {:.3f} incl. precondition, inline work on the critical path {:.3f} per refresh, "
             "utilization {:.1f}% over the refresh period\n",
             k["model"].get<std::string>(), k["margin"].get<double>(), k["data_parallel"].get<int>(),
             k["refresh_steps"].dump(), k["lower_bound_refresh_steps"].dump(), k["step_time"].get<double>(),
             k["inline_time"].get<double>(), 100 * k["utilization"].get<double>());
  if (!k["splits"].empty())
    fmt::print("{} inversions split into diagonal blocks (block-diagonal factor: larger than every bubble, or "
               "shortening the refresh period)\n",
               k["splits"].size());
  for (const auto& sp : k["placement"])
    fmt::print("stage {}{}: {} inversion pieces broadcast from their owner, {} inverted on every replica; "
               "modelled loads {}\n",
               sp["stage"].get<int>(), sp["pipeline"].get<int>() ? fmt::format(" (pipeline {})", sp["pipeline"].get<int>()) : "",
               sp["communicated"].get<int>(), sp["non_communicated"].get<int>(), sp["load"].dump());
  fmt::print("{}\n\n{}", k["precondition_line"].get<std::string>(), k["timeline_text"].get<std::string>());
}

// The end of each device's step as lowering makes it, per hosted stage in stage order: the
// gradient all-reduce among W replicas (alpha + beta * the stage's gradient bytes), then the
// optimizer (the profile's measured time).
void add_step_end(Schedule& s, bool grad_sync, bool optimizer) {
  for (auto& list : s.per_device) {
    std::set<std::pair<int, int>> hosted;  // (stage, pipeline)
    for (const Action& x : list)
      if (x.kind == Kind::F) hosted.insert({x.stage, x.pipeline});
    if (grad_sync)
      for (auto [stage, pipeline] : hosted) list.push_back(act(Kind::ALLREDUCE, stage, -1, pipeline));
    if (optimizer)
      for (auto [stage, pipeline] : hosted) list.push_back(act(Kind::OPT, stage, -1, pipeline));
  }
}

// The optimizer steps that end the slowest device's step (PipeFisher plans without them; the
// runtime appends them to every planned step).
double optimizer_tail(const Schedule& s, const CostModel& cost) {
  double worst = 0;
  for (const auto& list : s.per_device) {
    std::set<std::pair<int, int>> hosted;
    double t = 0;
    for (const Action& x : list)
      if (x.kind == Kind::F && hosted.insert({x.stage, x.pipeline}).second) t += cost.stage(x.stage).optimizer;
    worst = std::max(worst, t);
  }
  return worst;
}

// The memory model's per-stage input: the profile's, or estimated from --model's shapes when the
// profile has none (durations from flags, or a profile without memory).
std::vector<StageMemory> stage_memory(const PlanArgs& a, const Profile& prof) {
  bool measured = false;
  for (const StageMemory& m : prof.memory) measured = measured || m.param > 0 || m.act > 0;
  if (measured) return prof.memory;
  int blocks = a.given("--layers-per-stage") ? a.layers_per_stage : 1;
  const ModelConfig m = model_preset(a.model);
  if (!prof.kfac.empty())  // the run's own blocks per stage
    blocks = std::max<int>(1, prof.kfac.front().layers() / static_cast<int>(block_linears(name_of(m.arch), m.hidden, m.ffn).size()));
  return {block_memory(m, blocks, std::max(1, prof.micro_batch_size))};
}

int run(PlanArgs& a) {
  apply_profile_run(a);
  if (!a.kfac)
    for (const char* f : {"--margin", "--split-to-shorten", "--no-stage-group", "--bcast-alpha", "--bcast-beta"})
      if (a.given(f)) usage_error(f, "only applies with --kfac");
  if (a.kfac && a.sweep) usage_error("--kfac", "not available with --sweep");
  if (a.data_parallel > kMaxDevices)
    usage_error("--data-parallel", "{} replicas, more than the {} the planner takes (sim/limits.hpp)", a.data_parallel,
                kMaxDevices);
  if (a.given("--virtual-stages") && a.schedule != "interleaved")
    usage_error("--virtual-stages", "only applies to --schedule interleaved");
  if (a.given("--sweep-stages") && !a.sweep) usage_error("--sweep-stages", "only applies with --sweep");
  check_outputs({{a.csv, "--csv", true}, {a.svg, "--svg", true}, {a.trace, "--trace", true}},
                {{a.profile, "--profile"}, {a.schedule_file, "--schedule-file"}});
  if (a.sweep) return run_sweep_mode(a);
  if (a.schedule.empty() == a.schedule_file.empty())
    usage_error("--schedule", "give either --schedule NAME or --schedule-file FILE");

  Schedule s;
  if (!a.schedule_file.empty()) {
    for (const char* f : {"--stages", "--micro-batches"})
      if (a.given(f)) usage_error(f, "comes from --schedule-file");
    s = read_schedule_file(a.schedule_file);
  } else {
    if (!a.has("--stages")) usage_error("--stages", "required with --schedule");
    if (!a.has("--micro-batches")) usage_error("--micro-batches", "required with --schedule");
    // The work bound before the schedule is made: each micro-batch passes each stage (of each
    // model chunk) as F and B with a send and a receive each way.
    const int v = a.has("--virtual-stages") ? a.virtual_stages : 2;
    const int64_t estimate = int64_t{6} * a.stages * a.micro_batches * (a.schedule == "interleaved" ? v : 1);
    check_schedule_size(a.stages, estimate, a.kfac,
                        a.stages > kMaxDevices                                     ? "--stages"
                        : a.schedule == "interleaved" && v > a.micro_batches ? "--virtual-stages"
                                                                               : "--micro-batches");
    // Chimera's order is chosen for the durations (the profile's, or --tf/--tb).
    s = make_schedule(a.schedule, a.stages, a.micro_batches, v, 1, profile_of(a).cost.backward_forward_ratio());
  }
  check_schedule_size(s.devices, static_cast<int64_t>(s.num_actions()), a.kfac,
                      a.schedule_file.empty() ? "--micro-batches" : "--schedule-file");
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    std::fprintf(stderr, "%s", e.grid.c_str());
    throw;
  }
  const Profile prof = profile_of(a);
  if (prof.cost.stages.size() > 1 && static_cast<int>(prof.cost.stages.size()) != s.stages)
    usage_error("--profile", "profile has {} stages but the schedule has {}", prof.cost.stages.size(), s.stages);

  // A run's profile (optimizer times measured): the step ends as the run's did.
  const double opt_tail = prof.run ? optimizer_tail(s, prof.cost) : 0;
  if (!a.kfac) add_step_end(s, a.data_parallel > 1, prof.run.has_value());
  Timeline tl = simulate(s, prof.cost);
  const char* durations = a.profile.empty() ? "--tf/--tb/--tcomm" : "--profile";
  check_step_time(tl.step_time, durations);
  if (a.kfac && !(tl.step_time > 0))
    usage_error(durations, "the step takes 0 ms: PipeFisher has no bubbles to fill (give the forward or backward a "
                "duration)");
  MemoryReport mem = memory_model(s, tl, stage_memory(a, prof), a.recompute);
  const std::string title = fmt::format("{} D={} N={}{}", s.name, s.devices, s.micro_batches,
                                        s.name == "interleaved" ? fmt::format(" V={}", s.stages / s.devices) : "");
  nlohmann::json kfac;
  if (a.kfac) kfac = run_kfac(a, s, prof, title, tl.mean_bubble());  // draws the whole refresh period
  if (!a.kfac && !a.svg.empty()) {
    SvgOptions o;
    o.title = title;
    write_output({a.svg, "--svg", true}, timeline_svg(tl, o));
  }
  if (!a.kfac && !a.trace.empty()) write_output({a.trace, "--trace", true}, chrome_trace(tl, title));
  if (!a.csv.empty()) write_output({a.csv, "--csv", true}, to_csv(s));

  const int peak = *std::max_element(tl.peak_in_flight.begin(), tl.peak_in_flight.end());
  if (a.json) {
    nlohmann::json per = nlohmann::json::array();
    for (int d = 0; d < s.devices; ++d)
      per.push_back({{"device", d}, {"busy", tl.busy[d]}, {"bubble", tl.bubble[d]},
                     {"utilization", tl.utilization[d]}, {"peak_in_flight", tl.peak_in_flight[d]}});
    nlohmann::json j = {
        {"schedule", s.name}, {"stages", s.devices}, {"virtual_stages", s.stages / s.devices},
        {"pipelines", s.pipelines}, {"micro_batches", s.micro_batches}, {"recompute", a.recompute}, {"time_unit", "ms"},
        {"step_time", tl.step_time}, {"bubble_time", tl.mean_bubble()}, {"utilization", tl.mean_utilization()},
        {"per_device", per}, {"peak_in_flight", peak},
        {"memory", {{"unit", "MB"}, {"worst_device", mem.device}, {"params", mem.params},
                    {"activations", mem.activations}, {"err_peak", mem.err_peak}, {"m_pipe", mem.m_pipe},
                    {"activations_in_flight", mem.activations_in_flight}, {"m_pipe_in_flight", mem.m_pipe_in_flight},
                    {"curv", mem.curv}, {"inv", mem.inv}, {"err_save", mem.err_save}, {"m_kfac", mem.m_kfac}}}};
    if (a.kfac) {
      kfac.erase("timeline_text");
      kfac.erase("precondition_line");
      j["kfac"] = kfac;
    }
    j["data_parallel"] = a.data_parallel;
    if (prof.run)  // the step the run should measure: PipeFisher's with the optimizer after it
      j["predicted_step_time"] = a.kfac ? kfac["step_time"].get<double>() + opt_tail : tl.step_time;
    if (prof.run) {  // what the profile's own run measured, beside this prediction
      std::vector<std::string> filled(a.from_profile.begin(), a.from_profile.end());
      j["profile_run"] = {{"schedule", prof.run->schedule}, {"devices", prof.run->devices},
                          {"micro_batches", prof.run->micro_batches}, {"replicas", prof.run->replicas},
                          {"model", prof.run->model}, {"kfac", prof.run->kfac},
                          {"measured_step_time", prof.run->step_time}, {"flags_from_profile", filled}};
    }
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  fmt::print("{}: {} devices, {} stages{}, {} micro-batches{}{} (times in ms)\n", s.name, s.devices, s.stages,
             s.pipelines > 1 ? " per pipeline x 2 pipelines" : "", s.micro_batches,
             a.recompute ? ", activation recomputation" : "",
             a.data_parallel > 1 ? fmt::format(", {} data-parallel replicas", a.data_parallel) : "");
  if (prof.run)
    fmt::print("profile: measured on {} D={} N={} W={}{}, step {:.2f} ms; predicted here {:.2f} ms\n", prof.run->schedule,
               prof.run->devices, prof.run->micro_batches, prof.run->replicas,
               prof.run->kfac != "off" ? fmt::format(" with K-FAC ({})", prof.run->kfac) : "", prof.run->step_time,
               a.kfac ? kfac["step_time"].get<double>() + opt_tail : tl.step_time);
  fmt::print("step time {:.3f}, bubble {:.3f} per device, utilization {:.1f}%, peak in flight {}\n", tl.step_time,
             tl.mean_bubble(), 100 * tl.mean_utilization(), peak);
  fmt::print("memory (worst device {}): M_pipe {:.1f} MB ({:.1f} with the activations actually in flight), "
             "M_kfac+ {:.1f} MB\n\n",
             mem.device, mem.m_pipe, mem.m_pipe_in_flight, mem.m_kfac);
  if (a.kfac) print_kfac(kfac);
  else fmt::print("{}", timeline_text(tl));
  return 0;
}

Runner setup(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  a->app = &app;
  // CLI11's own range check prints the whole double range; say it plainly instead.
  // Durations: finite, >= 0 and within a double's microsecond range (sim/limits.hpp); inf, nan
  // and 1e308 would make an infinite or NaN step.
  // (strtod: a subnormal such as 1e-310 is a number, 1e999 overflows to inf.)
  auto in_range = [](const std::string& v, double hi) {
    char* end = nullptr;
    const double x = v.empty() ? -1 : std::strtod(v.c_str(), &end);
    return !v.empty() && end == v.c_str() + v.size() && std::isfinite(x) && x >= 0 && x <= hi;
  };
  const CLI::Validator nonneg(
      [in_range](std::string& v) -> std::string {
        if (in_range(v, kMaxDuration)) return "";
        return fmt::format("must be a finite number of ms in [0, {:.4g}], got '{}'", kMaxDuration, v);
      },
      "MS");
  const CLI::Validator fraction(
      [in_range](std::string& v) -> std::string {
        if (in_range(v, 1000)) return "";
        return "must be a finite number in [0, 1000], got '" + v + "'";
      },
      "X");
  const CLI::Validator positive(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          if (std::stoi(v, &used) >= 1 && used == v.size()) return "";
        } catch (const std::exception&) {
        }
        return "must be an integer >= 1, got '" + v + "'";
      },
      "N");
  app.add_option("--schedule", a->schedule, "naive, gpipe, 1f1b, interleaved, chimera or zb-h1");
  app.add_option("--schedule-file", a->schedule_file, "Read the schedule (text, or CSV if *.csv) instead");
  app.add_option("--stages", a->stages, "Pipeline stages D (= devices)")->check(positive);
  app.add_option("--micro-batches", a->micro_batches, "Micro-batches N per step")->check(positive);
  app.add_option("--virtual-stages", a->virtual_stages, "Model chunks V per device (interleaved; default 2)")->check(positive);
  app.add_option("--tf", a->tf, "Forward time of one micro-batch on one stage, ms (default 1)")->check(nonneg);
  app.add_option("--tb", a->tb, "Backward time, ms (default 2)")->check(nonneg);
  app.add_option("--tcomm", a->tcomm, "Point-to-point time per stage-to-stage message, ms (default 0)")->check(nonneg);
  app.add_option("--tcurv", a->tcurv, "K-FAC curvature time per micro-batch per stage, ms")->check(nonneg);
  app.add_option("--tinv", a->tinv, "K-FAC inversion time per stage, ms")->check(nonneg);
  app.add_option("--tprec", a->tprec, "K-FAC precondition time per stage, ms")->check(nonneg);
  app.add_option("--profile", a->profile, "Durations from a profile: the paper's CSV or pipefisher's JSON");
  app.add_option("--micro-batch-size", a->micro_batch_size, "Profile CSV row (bs) to use")->check(positive);
  app.add_option("--layers-per-stage", a->layers_per_stage, "Transformer blocks per stage (scales the CSV profile)")
      ->check(positive);
  app.add_flag("--json", a->json, "Print one JSON object");
  app.add_option("--svg", a->svg, "Write the timeline (or the sweep chart) as SVG");
  app.add_option("--trace", a->trace, "Write a Chrome trace-event JSON (open in Perfetto)");
  app.add_option("--csv", a->csv, "Write the schedule as CSV (or the sweep table)");
  app.add_flag("--kfac", a->kfac, "PipeFisher: place K-FAC work into the bubbles and report it");
  app.add_flag("--no-kfac", a->no_kfac, "With a K-FAC run's profile: plan it without K-FAC");
  app.add_option("--model", a->model,
                 "Model preset: its shapes size the memory model and split the K-FAC costs (default bert-base)");
  app.add_option("--data-parallel", a->data_parallel, "Replicas W per stage (curvature sync, inversions shared)")
      ->check(positive);
  app.add_option("--margin", a->margin, "Safety margin: a unit fits a gap if duration*(1+margin) <= gap (default 0.05)")
      ->check(fraction);
  app.add_option("--bcast-alpha", a->bcast_alpha,
                 "Broadcast of an inverse among replicas: alpha, ms (default: the profile's all-reduce alpha, else 0)")
      ->check(nonneg);
  app.add_option("--bcast-beta", a->bcast_beta,
                 "Broadcast: beta, ms per byte of the upper triangle (default: the profile's all-reduce beta, else 0)")
      ->check(nonneg);
  app.add_flag("--split-to-shorten", a->split_to_shorten,
               "Also split an inversion into diagonal blocks when that shortens the refresh period (default: exact "
               "factors, split only when larger than every bubble)");
  app.add_flag("--no-stage-group", a->no_stage_group,
               "Chimera: every pipeline copy inverts all its stage's factors and all devices share one cycle, "
               "instead of the twins sharing them (as the runtime does)");
  app.add_flag("--sweep", a->sweep, "Performance model over micro-batch sizes, D and N = D, 2D, 3D");
  app.add_flag("--recompute", a->recompute,
               "Activation recomputation (R, the runtime's parallel.recompute): every backward repeats its forward "
               "(add it to durations measured without R), one M_act per stage; with --kfac, A's curvature follows "
               "the backward");
  app.add_option("--sweep-stages", a->sweep_stages, "Depths D for --sweep (default 4 8 16 32)")->delimiter(',');
  return [a] { return run(*a); };
}

}  // namespace

PF_COMMAND(plan, "plan", "Generate, validate and simulate a pipeline schedule; draw, trace or sweep it", setup)

}  // namespace pf::app
