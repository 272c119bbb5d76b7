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
//     PipeFisher: K-FAC work placed into the bubbles (plan/planner.hpp); costs per stage per
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
#include "cmd_plan.hpp"
#include "command.hpp"
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "nn/names.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "schedule/torch_csv.hpp"
#include "schedule/validate.hpp"
#include "sim/limits.hpp"
#include "sim/memory.hpp"
#include "plan/planner.hpp"
#include "runtime/layout.hpp"
#include "sim/profile.hpp"
#include "sim/sim.hpp"
#include "sim/sweep.hpp"
#include "viz/render.hpp"
#include "viz/sweep_chart.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>

namespace pf::app {
namespace {

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
std::vector<StageMemory> stage_memory(const PlanRequest& r, const Profile& prof) {
  bool measured = false;
  for (const StageMemory& m : prof.memory) measured = measured || m.param > 0 || m.act > 0;
  if (measured) return prof.memory;
  int blocks = r.blocks_per_stage();
  ModelConfig m = model_preset(r.model);
  if (r.seq_len > 0) m.seq_len = r.seq_len;
  if (!prof.plan.kfac.empty())  // the run's own blocks per stage
    blocks = std::max<int>(1, prof.plan.kfac.front().layers() / static_cast<int>(block_linears(m).size()));
  return {block_memory(m, blocks, std::max(1, prof.micro_batch_size))};
}

// --schedule NAME generated for --stages and --micro-batches, within the work bound.
Schedule generated_schedule(const PlanRequest& r) {
  const ScheduleRequest& q = r.schedule;
  const int D = *q.stages, N = *q.micro_batches, v = q.v();
  const ScheduleName name = *q.name;
  // The work bound before the schedule is made.
  check_schedule_size(D, schedule_size_bound(name, D, N, v), r.kfac_mode(),
                      D > kMaxDevices                                        ? "--stages"
                      : name == ScheduleName::Interleaved && v > N ? "--virtual-stages"
                                                                   : "--micro-batches");
  // Chimera's and the zero-bubble heuristic's orders are chosen for the durations (the profile's, or the flags).
  const CostModel& cost = r.profile.cost;
  return make_schedule(name, D, N, v, 1, cost.backward_forward_ratio(), zb_spec(cost, q.zb_memory));
}

// The schedule to simulate: read from --schedule-file or generated, then validated (the
// validator's grid on stderr when it fails).
Schedule plan_schedule(const PlanRequest& r) {
  const bool from_file = !r.schedule.file.empty();
  Schedule s = from_file ? read_schedule_file(r.schedule.file) : generated_schedule(r);
  check_schedule_size(s.devices, static_cast<int64_t>(s.num_actions()), r.kfac_mode(),
                      from_file ? "--schedule-file" : "--micro-batches");
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    std::fprintf(stderr, "%s", e.grid.c_str());
    throw;
  }
  return s;
}

// One simulated step and what the reports say of it.
struct SimulatedStep {
  Schedule schedule;
  Profile profile;
  Timeline timeline;
  MemoryReport memory;
  std::string title;
  double optimizer_tail = 0;  // a run's profile: the optimizer steps PipeFisher plans without
  nlohmann::json kfac;        // run_kfac's report; null without --kfac
  int peak_in_flight = 0;
};

// The step the profile's run should measure: PipeFisher's with the optimizer after it.
double predicted_step_time(const PlanRequest& q, const SimulatedStep& r) {
  return q.kfac_mode() ? r.kfac["step_time"].get<double>() + r.optimizer_tail : r.timeline.step_time;
}

SimulatedStep simulate_step(const PlanRequest& q, Schedule s) {
  SimulatedStep r;
  // With --kfac (stage_blocks) the model's Linears are listed; without, a named model's depth
  // bounds the blocks too (an unnamed one only sizes memory the paper's CSV already measured).
  if (q.model_named) check_layers_per_stage(q, s);
  r.profile = q.partition.empty() ? q.profile : with_stage_blocks(q.profile, stage_blocks(q, s));
  const Profile& prof = r.profile;
  if (prof.cost.stages.size() > 1 && static_cast<int>(prof.cost.stages.size()) != s.stages)
    usage_error("--profile", "profile has {} stages but the schedule has {}", prof.cost.stages.size(), s.stages);
  // A run's profile (optimizer times measured): the step ends as the run's did.
  r.optimizer_tail = prof.run ? optimizer_tail(s, prof.cost) : 0;
  if (!q.kfac_mode()) append_step_end(s, {.grad_sync = q.data_parallel > 1, .optimizer = prof.run.has_value()});
  r.timeline = simulate(s, prof.cost);
  const char* durations = q.durations_flag();
  check_step_time(r.timeline.step_time, durations);
  if (q.kfac_mode() && !(r.timeline.step_time > 0))
    usage_error(durations, "the step takes 0 ms: PipeFisher has no bubbles to fill (give the forward or backward a "
                "duration)");
  r.memory = memory_model(s, r.timeline, stage_memory(q, prof), q.recompute);
  r.title = fmt::format("{} D={} N={}{}", s.name, s.devices, s.micro_batches,
                        s.name == "interleaved" ? fmt::format(" V={}", s.stages / s.devices) : "");
  if (q.kfac_mode()) r.kfac = run_kfac(q, s, prof, r.title, r.timeline.mean_bubble());  // draws the whole refresh period
  r.peak_in_flight = *std::max_element(r.timeline.peak_in_flight.begin(), r.timeline.peak_in_flight.end());
  r.schedule = std::move(s);
  return r;
}

// --svg, --trace (the step's own; --kfac draws its refresh period) and --csv.
void write_files(const PlanRequest& q, const SimulatedStep& r) {
  const PlanOutputs& out = q.out;
  // The CSV first: a schedule torch's form cannot hold (Chimera) is refused before any file is written.
  const std::string csv = out.csv.empty()                          ? ""
                          : out.csv_format == CsvFormat::torch ? to_torch_csv(r.schedule)
                                                                 : to_csv(r.schedule);
  if (!q.kfac_mode() && !out.svg.empty()) {
    SvgOptions o;
    o.title = r.title;
    if (out.svg_steps > 0) o.steps = out.svg_steps;
    o.width = out.svg_width;
    write_output({out.svg, "--svg", true}, timeline_svg(r.timeline, o));
  }
  if (!q.kfac_mode() && !out.trace.empty()) write_output({out.trace, "--trace", true}, chrome_trace(r.timeline, r.title));
  if (!out.csv.empty()) write_output({out.csv, "--csv", true}, csv);
}

nlohmann::json memory_json(const MemoryReport& mem) {
  return {{"unit", "MB"}, {"worst_device", mem.device}, {"params", mem.params},
          {"activations", mem.activations}, {"err_peak", mem.err_peak}, {"m_pipe", mem.m_pipe},
          {"activations_in_flight", mem.activations_in_flight}, {"m_pipe_in_flight", mem.m_pipe_in_flight},
          {"curv", mem.curv}, {"inv", mem.inv}, {"err_save", mem.err_save}, {"m_kfac", mem.m_kfac}};
}

void print_json(const PlanRequest& a, SimulatedStep& r) {
  const Schedule& s = r.schedule;
  const Timeline& tl = r.timeline;
  nlohmann::json per = nlohmann::json::array();
  for (int d = 0; d < s.devices; ++d)
    per.push_back({{"device", d}, {"busy", tl.busy[d]}, {"bubble", tl.bubble[d]},
                   {"utilization", tl.utilization[d]}, {"peak_in_flight", tl.peak_in_flight[d]}});
  nlohmann::json j = {
      {"schedule", s.name}, {"stages", s.devices}, {"virtual_stages", s.stages / s.devices},
      {"pipelines", s.pipelines}, {"micro_batches", s.micro_batches}, {"recompute", a.recompute},
      {"time_unit", a.unit_durations ? "unit" : "ms"},
      {"step_time", tl.step_time}, {"bubble_time", tl.mean_bubble()}, {"utilization", tl.mean_utilization()},
      {"per_device", per}, {"peak_in_flight", r.peak_in_flight}, {"memory", memory_json(r.memory)}};
  if (const std::vector<std::string> w = a.warnings(); !w.empty()) j["warnings"] = w;
  if (a.kfac_mode()) {
    r.kfac.erase("timeline_text");
    r.kfac.erase("precondition_line");
    j["kfac"] = r.kfac;
  }
  j["data_parallel"] = a.data_parallel;
  if (const std::optional<ProfileRun>& run = r.profile.run) {
    j["predicted_step_time"] = predicted_step_time(a, r);
    // What the profile's own run measured, beside this prediction.
    const std::vector<std::string>& filled = a.from_profile;
    j["profile_run"] = {{"schedule", run->schedule}, {"devices", run->devices},
                        {"micro_batches", run->micro_batches}, {"replicas", run->replicas},
                        {"model", run->model}, {"kfac", run->kfac},
                        {"measured_step_time", run->step_time}, {"flags_from_profile", filled}};
  }
  fmt::print("{}\n", j.dump(1));
}

void print_text(const PlanRequest& a, const SimulatedStep& r) {
  const Schedule& s = r.schedule;
  const Timeline& tl = r.timeline;
  const MemoryReport& mem = r.memory;
  fmt::print("{}: {} devices, {} stages{}, {} micro-batches{}{} (times in {})\n", s.name, s.devices, s.stages,
             s.pipelines > 1 ? " per pipeline x 2 pipelines" : "", s.micro_batches,
             a.recompute ? ", activation recomputation" : "",
             a.data_parallel > 1 ? fmt::format(", {} data-parallel replicas", a.data_parallel) : "",
             a.unit_durations ? "units" : "ms");
  for (const std::string& w : a.warnings()) fmt::print("warning: {}\n", w);
  if (const std::optional<ProfileRun>& run = r.profile.run)
    fmt::print("profile: measured on {} D={} N={} W={}{}, step {:.2f} ms; predicted here {:.2f} ms\n", run->schedule,
               run->devices, run->micro_batches, run->replicas,
               run->kfac != "off" ? fmt::format(" with K-FAC ({})", run->kfac) : "", run->step_time,
               predicted_step_time(a, r));
  // With --kfac a second step time follows: this one is named as the schedule's alone.
  fmt::print("{}step time {:.3f}, bubble {:.3f} per device, utilization {:.1f}%, peak in flight {}\n",
             a.kfac_mode() ? "without K-FAC: " : "", tl.step_time, tl.mean_bubble(), 100 * tl.mean_utilization(),
             r.peak_in_flight);
  fmt::print("memory (worst device {}): M_pipe {:.1f} MB ({:.1f} with the activations actually in flight), "
             "M_kfac+ {:.1f} MB\n\n",
             mem.device, mem.m_pipe, mem.m_pipe_in_flight, mem.m_kfac);
  if (a.kfac_mode()) print_kfac(r.kfac);
  else fmt::print("{}", timeline_text(tl));
}

// --sweep: the paper's performance model over --sweep-stages.
int run_sweep_mode(const PlanRequest& q) {
  SweepSpec spec;
  const ScheduleName name = *q.schedule.name;
  spec.schedule = name_of(name);
  for (int d : q.sweep_stages) {
    // One stage has no bubbles: the ratio of K-FAC work to bubble time would be infinite.
    if (d < 2) usage_error("--sweep-stages", "depths must be >= 2 (a pipeline with bubbles), got {}", d);
    // The sweep's largest schedule: N = 3D micro-batches.
    check_schedule_size(d, schedule_size_bound(name, d, 3 * d, q.schedule.v()), false, "--sweep-stages");
  }
  spec.stages = q.sweep_stages;
  spec.recompute = q.recompute;
  spec.zb_memory = q.schedule.zb_memory;
  spec.virtual_stages = q.schedule.v();
  std::vector<SweepRow> rows = run_sweep(spec, q.sweep_profiles);
  if (rows.empty()) usage_error("--sweep-stages", "schedule {} is defined for none of the requested depths", spec.schedule);
  for (const SweepRow& r : rows) {
    if (!(r.t_pipe > 0)) usage_error(q.durations_flag(), "the step takes 0 ms: no throughput to sweep (give the forward or backward a duration)");
    check_step_time(r.t_pipe + r.t_prec + r.t_curv_inv, q.durations_flag());
  }
  const std::string csv = sweep_csv(rows);
  if (!q.out.csv.empty()) write_output({q.out.csv, "--csv", true}, csv);
  if (!q.out.svg.empty())
    write_output({q.out.svg, "--svg", true}, sweep_svg(rows, fmt::format("Performance model: {}", spec.schedule)));
  if (q.out.json) {
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
    if (q.out.csv.empty()) fmt::print("{}", csv);
    print_outputs(q.out);
  }
  return 0;
}

int run(PlanFlags& flags) {
  const PlanRequest q = request_of(flags);
  if (q.mode == PlanMode::sweep) return run_sweep_mode(q);
  SimulatedStep r = simulate_step(q, plan_schedule(q));
  write_files(q, r);
  if (q.out.json) {
    print_json(q, r);
  } else {
    print_text(q, r);
    print_outputs(q.out);
  }
  return 0;
}

// CLI11's own range check prints the whole double range; these say it plainly instead.
struct PlanValidators {
  CLI::Validator nonneg, fraction, positive;
};

PlanValidators plan_validators() {
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
  return {nonneg, fraction, positive};
}

// The schedule, its durations and the outputs.
void add_schedule_options(CLI::App& app, PlanFlags& a, const PlanValidators& v) {
  app.add_option("--schedule", a.schedule, "naive, gpipe, 1f1b, interleaved, chimera, zb-h1, zb-h2, zb-auto or zb-v");
  app.add_option("--schedule-file", a.schedule_file, "Read the schedule (text, or CSV if *.csv) instead");
  app.add_option("--stages", a.stages, "Pipeline stages D (= devices)")->check(v.positive);
  app.add_option("--micro-batches", a.micro_batches, "Micro-batches N per step")->check(v.positive);
  app.add_option("--virtual-stages", a.virtual_stages, "Model chunks V per device (interleaved; default 2)")->check(v.positive);
  app.add_option("--tf", a.tf, "Forward time of one micro-batch on one stage, ms (default 1)")->check(v.nonneg);
  app.add_option("--tb", a.tb, "Backward time, ms (default 2); with --tw, the input gradient's (I)")->check(v.nonneg);
  app.add_option("--tw", a.tw, "Weight-gradient time (W), ms: zero-bubble schedules run it apart, others as B = I + W")
      ->check(v.nonneg);
  app.add_option("--zb-memory", a.zb_memory, "zb-auto's memory limit, times 1F1B's peak (default 1: ZB-1p; 2: ZB-2p)");
  app.add_option("--tcomm", a.tcomm, "Point-to-point time per stage-to-stage message, ms (default 0)")->check(v.nonneg);
  app.add_option("--tcurv", a.tcurv, "K-FAC curvature time per micro-batch per stage, ms")->check(v.nonneg);
  app.add_option("--tinv", a.tinv, "K-FAC inversion time per stage, ms")->check(v.nonneg);
  app.add_option("--tprec", a.tprec, "K-FAC precondition time per stage, ms")->check(v.nonneg);
  app.add_option("--profile", a.profile, "Durations from a profile: the paper's CSV or pipefisher's JSON");
  app.add_option("--micro-batch-size", a.micro_batch_size, "Profile CSV row (bs) to use")->check(v.positive);
  app.add_option("--seq-len", a.seq_len,
                 "Tokens per sequence the memory model sizes activations for, when it estimates them from --model's "
                 "shapes (default 128, model.seq_len's)")
      ->check(v.positive);
  app.add_option("--layers-per-stage", a.layers_per_stage, "Transformer blocks per stage (scales the CSV profile)")
      ->check(v.positive);
  app.add_option("--partition", a.partition,
                 "Transformer blocks of each stage, e.g. 2,4,4,2 (as parallel.partition; summing to --model's layers): "
                 "scales the CSV profile stage by stage")
      ->delimiter(',')
      ->check(v.positive);
  app.add_flag("--json", a.json, "Print one JSON object");
  app.add_option("--svg", a.svg, "Write the timeline (or the sweep chart) as SVG");
  app.add_option("--steps", a.svg_steps, "Steps --svg draws (default 2; with --kfac the whole refresh period)")
      ->check(v.positive);
  app.add_option("--width", a.svg_width, "Pixels of --svg's time axis, 200 to 16000 (default: 24 px per forward)")
      ->check(v.positive);
  app.add_option("--trace", a.trace, "Write a Chrome trace-event JSON (open in Perfetto)");
  app.add_option("--csv", a.csv, "Write the schedule as CSV (or the sweep table)");
  app.add_option("--csv-format", a.csv_format,
                 "--csv's form: pipefisher (ours, with its header) or torch (torch.distributed.pipelining's: one "
                 "row per rank, cells such as 0F0 and 2I3; --schedule-file reads either)")
      ->check(CLI::IsMember({"pipefisher", "torch"}));
}

// PipeFisher (--kfac), data parallelism, recomputation and the sweep.
void add_kfac_options(CLI::App& app, PlanFlags& a, const PlanValidators& v) {
  app.add_flag("--kfac", a.kfac, "PipeFisher: place K-FAC work into the bubbles and report it");
  app.add_flag("--no-kfac", a.no_kfac, "With a K-FAC run's profile: plan it without K-FAC");
  app.add_option("--model", a.model,
                 "Model preset: its shapes size the memory model and split the K-FAC costs (default bert-base)");
  app.add_option("--data-parallel", a.data_parallel, "Replicas W per stage (curvature sync, inversions shared)")
      ->check(v.positive);
  app.add_option("--margin", a.margin,
                 fmt::format("Safety margin: a unit fits a gap if duration*(1+margin) <= gap (default {:g})", kFitMargin))
      ->check(v.fraction);
  app.add_option("--bcast-alpha", a.bcast_alpha,
                 "Broadcast of an inverse among replicas: alpha, ms (default: the profile's all-reduce alpha, else 0)")
      ->check(v.nonneg);
  app.add_option("--bcast-beta", a.bcast_beta,
                 "Broadcast: beta, ms per byte of the upper triangle (default: the profile's all-reduce beta, else 0)")
      ->check(v.nonneg);
  app.add_flag("--split-to-shorten", a.split_to_shorten,
               "Also split an inversion into diagonal blocks when that shortens the refresh period (default: exact "
               "factors, split only when larger than every bubble)");
  app.add_option("--min-refresh-steps", a.min_refresh_steps,
                 "The shortest refresh cycle in steps, however generous the bubbles (precond.min_refresh_steps; default 1)")
      ->check(CLI::Range(1, kMaxRefreshSteps));
  app.add_flag("--no-stage-group", a.no_stage_group,
               "Chimera: every pipeline copy inverts all its stage's factors and all devices share one cycle, "
               "instead of the twins sharing them (as the runtime does)");
  app.add_flag("--sweep", a.sweep, "Performance model over micro-batch sizes, D and N = D, 2D, 3D");
  app.add_flag("--recompute", a.recompute,
               "Activation recomputation (R, the runtime's parallel.recompute): every backward repeats its forward "
               "(add it to durations measured without R), one M_act per stage; with --kfac, A's curvature follows "
               "the backward");
  app.add_option("--sweep-stages", a.sweep_stages, "Depths D for --sweep (default 4 8 16 32)")->delimiter(',');
}

Runner setup(CLI::App& app) {
  auto a = std::make_shared<PlanFlags>();
  a->app = &app;
  const PlanValidators v = plan_validators();
  add_schedule_options(app, *a, v);
  add_kfac_options(app, *a, v);
  return [a] { return run(*a); };
}

}  // namespace

// --layers-per-stage against the model's depth, the bound --partition's blocks meet
// (runtime/layout.hpp's partition_blocks).
void check_layers_per_stage(const PlanRequest& r, const Schedule& s) {
  if (!r.layers_per_stage) return;
  const int layers = model_preset(r.model).layers;
  const int64_t blocks = int64_t{s.stages} * *r.layers_per_stage;
  if (blocks > layers)
    usage_error("--layers-per-stage", "{} stages x {} blocks = {} transformer blocks, but --model {} has {}{}", s.stages,
                *r.layers_per_stage, blocks, r.model, layers,
                s.devices < s.stages ? " (a device holding several stages counts each)" : "");
}

std::vector<int> stage_blocks(const PlanRequest& r, const Schedule& s) {
  if (r.partition.empty()) {
    check_layers_per_stage(r, s);
    return {r.blocks_per_stage()};
  }
  const std::string layers = fmt::format("--model {}'s layers", r.model);
  return partition_blocks(model_preset(r.model).layers, s.stages, r.partition,
                          {.partition = "--partition", .stages = "--partition", .layers = layers.c_str()});
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

PF_COMMAND(plan, "plan", "Generate, validate and simulate a pipeline schedule; draw, trace or sweep it", setup)

}  // namespace pf::app
