// pipefisher plan --kfac: PipeFisher planned on the simulated step (plan/planner.hpp), with its
// JSON `kfac` object, text summary, SVG and trace of the whole refresh period.
#include "cmd_plan.hpp"
#include "core/files.hpp"
#include "nn/names.hpp"
#include "plan/planner.hpp"
#include "runtime/layout.hpp"
#include "sim/limits.hpp"
#include "sim/sim.hpp"
#include "viz/render.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace pf::app {
namespace {

using nlohmann::json;

// The model whose Linear shapes split each stage's costs into K-FAC units.
struct KfacModel {
  bool measured = false;            // units measured per layer (a run's profile): no shapes needed
  ModelConfig config;
  std::string name;                 // "measured", or the preset
  std::vector<int> blocks;          // transformer blocks per stage: one entry for all, or one per stage
  std::vector<LinearShape> block;   // the Linears of one block
  int blocks_of(int stage) const { return blocks.size() == 1 ? blocks[0] : blocks.at(stage); }
};

KfacModel kfac_model(const PlanRequest& r, const Schedule& s, const Profile& prof) {
  KfacModel k;
  k.measured = !prof.plan.kfac.empty() && !r.layers_per_stage;
  k.config = k.measured && !r.model_named ? ModelConfig{} : model_preset(r.model);
  k.name = k.measured && !r.model_named ? std::string("measured") : r.model;
  k.blocks = stage_blocks(r, s);
  k.block = block_linears(k.config);
  return k;
}

// The Linears of stage s (after check_kfac_size).
std::vector<LinearShape> stage_linears(const KfacModel& m, int stage) {
  std::vector<LinearShape> layers;
  for (int b = 0; b < m.blocks_of(stage); ++b) layers.insert(layers.end(), m.block.begin(), m.block.end());
  return layers;
}

// K-FAC units per step: per device, per Linear of its blocks, curvature per micro-batch (A and B),
// two inversions and a precondition, on top of the schedule's own actions. Checked before the
// stage's Linears are listed (--layers-per-stage 2000000000 would list 12e9 of them).
void check_kfac_size(const PlanRequest& r, const Schedule& s, const Profile& prof, const KfacModel& m) {
  int64_t linears = int64_t{*std::max_element(m.blocks.begin(), m.blocks.end())} * static_cast<int64_t>(m.block.size());
  for (const StageKfacCost& k : prof.plan.kfac) linears = std::max<int64_t>(linears, k.layers());
  check_schedule_size(s.devices,
                      static_cast<int64_t>(s.num_actions()) + int64_t{s.devices} * linears * (2 * s.micro_batches + 3),
                      true, r.layers_per_stage ? "--layers-per-stage" : "--micro-batches");
}

PlanInput kfac_input(const PlanRequest& r, const Schedule& s, const Profile& prof, const KfacModel& m) {
  const KfacOptions& a = r.kfac;
  const PlanSettings settings{.replicas = r.data_parallel,
                              .margin = a.margin,
                              .split_to_shorten = a.split_to_shorten,
                              .chimera_group = a.stage_group,
                              .recompute = r.recompute,
                              .min_refresh_steps = a.min_refresh_steps};
  // Broadcast of an inverse among the replicas (Algorithm 1's t_comm): the flags, else the
  // profile's all-reduce fit (the same bytes over the same links; 0 without one: all CT).
  // A run's profile carries the broadcast model its plan used.
  const std::pair<double, double> bcast = {
      a.bcast_alpha.value_or(prof.plan.bcast_alpha >= 0 ? prof.plan.bcast_alpha : prof.cost.allreduce_alpha),
      a.bcast_beta.value_or(prof.plan.bcast_beta >= 0 ? prof.plan.bcast_beta : prof.cost.allreduce_beta)};
  // Units measured by the run, as it planned; else split from the model's shapes below.
  PlanInput in = plan_input(s, settings, bcast, m.measured ? prof.plan.kfac : std::vector<StageKfacCost>{});
  in.cost = prof.cost;
  if (m.measured) return in;
  for (size_t st = 0; st < prof.cost.stages.size(); ++st) {
    const StageCost& c = prof.cost.stages[st];
    const std::vector<LinearShape> layers = stage_linears(m, static_cast<int>(st));
    // Curvature sync: all-reduce of the stage's factors (the inverses travel in their own
    // BCAST_INV units), 4-byte floats; alpha + beta * bytes from the profile (0 without one).
    double floats = 0;
    for (const LinearShape& l : layers) floats += double(l.d_in) * l.d_in + double(l.d_out) * l.d_out;
    double bytes = c.curvature_bytes > 0 ? c.curvature_bytes : 4 * floats;
    in.kfac.push_back(split_stage_cost(layers, c.curvature, c.inversion, c.precondition,
                                       prof.cost.allreduce_alpha + prof.cost.allreduce_beta * bytes));
  }
  return in;
}

// K-FAC units named by their layer: the profile's names, else the model's, each stage holding the
// blocks the runtime's partition gives it (runtime/layout.hpp): --partition's, or --layers-per-stage each.
LayerNames kfac_layer_names(const Schedule& s, const Profile& prof, const KfacModel& m) {
  const std::vector<int> counts = m.blocks.size() > 1 ? m.blocks : partition_blocks(m.blocks[0] * s.stages, s.stages, {});
  LayerNames names;
  for (int st = 0, first = 0; st < s.stages; first += counts[st++])
    for (int pl = 0; pl < s.pipelines; ++pl) {
      if (m.measured && st < static_cast<int>(prof.layer_names.size())) {
        for (size_t l = 0; l < prof.layer_names[st].size(); ++l)
          if (!prof.layer_names[st][l].empty()) names[{pl, st, static_cast<int>(l)}] = prof.layer_names[st][l];
        continue;
      }
      int l = 0;
      for (int b = first; b < first + counts[st]; ++b)
        for (const std::string& n : block_linear_names(m.config.arch, b)) names[{pl, st, l++}] = n;
    }
  return names;
}

// The refresh period as SVG, with the numbers of the text and JSON reports.
// The refresh period (or --steps of it, from a cycle start) at --width.
void write_kfac_svg(const PlanOutputs& a, const KfacPlan& p, const std::string& title, double base_bubble) {
  const int steps = a.svg_steps > 0 ? a.svg_steps : p.period();
  SvgOptions o;
  o.title = title;
  o.width = a.svg_width;
  const Timeline tl = p.period_timeline(0, steps, &o.step_starts);
  o.summary = fmt::format("refresh period {} steps{}, step {:.2f} ms, utilization {:.1f}%, bubble {:.2f} ms per "
                          "device per step before K-FAC", p.period(),
                          steps == p.period() ? "" : fmt::format(" ({} drawn)", steps), p.step_time,
                          100 * p.utilization, base_bubble);
  write_output({a.svg, "--svg", true}, timeline_svg(tl, o));
}

json lower_bounds_json(const KfacPlan& p, int devices) {
  json lb = json::array();
  for (int d = 0; d < devices; ++d)
    lb.push_back(p.lower_bound_refresh_steps[d] < 0 ? json(nullptr) : json(p.lower_bound_refresh_steps[d]));
  return lb;
}

json per_device_json(const KfacPlan& p, const json& lower_bounds) {
  json per = json::array();
  for (size_t d = 0; d < lower_bounds.size(); ++d)
    per.push_back({{"device", d}, {"refresh_steps", p.refresh_steps[d]}, {"lower_bound_refresh_steps", lower_bounds[d]},
                   {"bubble", p.bubble[d]}, {"kfac_work", p.kfac_work[d]}, {"inline_work", p.device_inline[d]},
                   {"precondition", p.precondition[d]},
                   {"utilization", p.utilization_per_device[d]}, {"strategy", p.strategy[d]}});
  return per;
}

// W > 1: Algorithm 1 per stage (which pieces are broadcast, by whom, the modelled loads).
json placement_json(const KfacPlan& p) {
  json placement = json::array();
  for (const StagePlacement& sp : p.placements()) {
    json pieces = json::array();
    for (int k : sp.placement.order) {
      const int o = sp.placement.owner[k];
      pieces.push_back({{"piece", to_token(sp.pieces[k])}, {"dim", sp.dims[k]}, {"inversion", sp.inv_time[k]},
                        {"broadcast", sp.bcast_time[k]}, {"communicated", o != kEveryRank},
                        {"owner", o == kEveryRank ? json("every") : json(o)}});
    }
    json members = json::array();  // owner m is members[m]: {device, replica}
    for (auto [dev, rep] : sp.members) members.push_back({{"device", dev}, {"replica", rep}});
    placement.push_back({{"pipeline", sp.pipeline}, {"stage", sp.stage}, {"device", sp.device}, {"members", members},
                         {"communicated", sp.placement.communicated()},
                         {"non_communicated", static_cast<int>(sp.pieces.size()) - sp.placement.communicated()},
                         {"load", sp.placement.load}, {"makespan", sp.placement.makespan()}, {"pieces", pieces}});
  }
  return placement;
}

json splits_json(const KfacPlan& p) {
  json splits = json::array();
  for (const FactorSplit& f : p.splits())
    splits.push_back({{"pipeline", f.pipeline}, {"stage", f.stage}, {"layer", f.layer},
                      {"factor", f.kind == Kind::INV_A ? "A" : "B"}, {"blocks", f.blocks}, {"whole", f.whole},
                      {"pieces", f.pieces}});
  return splits;
}

json kfac_json(const PlanRequest& a, const KfacPlan& p, const PlanInput& in, const KfacModel& m, const Timeline& tl) {
  const json lb = lower_bounds_json(p, in.schedule.devices);
  json k = {{"refresh_steps", p.refresh_steps}, {"lower_bound_refresh_steps", lb}, {"utilization", p.utilization},
          {"step_time", p.step_time}, {"base_step_time", p.base_step_time}, {"inline_time", p.inline_time},
          {"period", p.period()}, {"common_cycle", p.common_cycle}, {"sync_steps", p.sync_steps}, {"data_parallel", a.data_parallel}, {"margin", a.kfac.margin},
          {"model", m.name}, {"layers_per_stage", m.blocks.size() == 1 ? json(m.blocks[0]) : json(m.blocks)}, {"splits", splits_json(p)}, {"per_device", per_device_json(p, lb)},
          {"bcast_alpha", in.bcast_alpha}, {"bcast_beta", in.bcast_beta}, {"placement", placement_json(p)},
          {"plain_step_time", p.plain_step_time}, {"precondition_share", p.precondition_share()},
          {"precondition_line", p.precondition_line()}, {"timeline_text", timeline_text(tl)}};
  const WeightGradientMoves& w = p.weight_gradients;
  if (w.total > 0)  // a split backward (zero-bubble)
    k["weight_gradients"] = {{"total", w.total}, {"moved", w.moved}, {"step_before", w.step_before},
                             {"step_after", w.step_after}, {"line", w.line()}};
  return k;
}

}  // namespace

json run_kfac(const PlanRequest& a, const Schedule& s, const Profile& prof, const std::string& title, double base_bubble) {
  const KfacModel m = kfac_model(a, s, prof);
  check_kfac_size(a, s, prof, m);
  const PlanInput in = kfac_input(a, s, prof, m);
  KfacPlan p = plan_kfac(in);
  for (double t : {p.step_time, p.base_step_time, p.inline_time}) check_step_time(t, "--kfac");
  const int P = p.period();
  std::vector<double> starts;
  Timeline tl = p.period_timeline(0, P, &starts);
  const std::string kt = fmt::format("{} + PipeFisher ({} steps{})", title, P,
                                     a.data_parallel > 1 ? fmt::format(", replica 0 of {}", a.data_parallel) : "");
  if (!a.out.svg.empty()) write_kfac_svg(a.out, p, kt, base_bubble);
  if (!a.out.trace.empty())
    write_output({a.out.trace, "--trace", true},
                 chrome_trace({TraceStep{.step = 1, .start = 0, .timeline = &tl}}, kt, kfac_layer_names(s, prof, m)));
  return kfac_json(a, p, in, m, tl);
}

// "[2,-]": a device without a bubble has no lower bound (its K-FAC work runs inline).
std::string lower_bound_text(const nlohmann::json& bounds) {
  std::vector<std::string> items;
  for (const auto& b : bounds) items.push_back(b.is_null() ? "-" : std::to_string(b.get<int>()));
  return fmt::format("[{}]", fmt::join(items, ","));
}

// One line per group of holders sharing a stage's inversions (Chimera lists a twin pair under
// both pipelines' copies of the stage: printed once).
void print_placements(const nlohmann::json& placements) {
  std::set<std::pair<int, std::set<int>>> printed;  // (stage, holders' devices)
  std::vector<nlohmann::json> by_stage(placements.begin(), placements.end());
  std::stable_sort(by_stage.begin(), by_stage.end(), [](const auto& x, const auto& y) { return x["stage"] < y["stage"]; });
  for (const auto& sp : by_stage) {
    std::set<int> devices;
    std::vector<std::string> holders, loads;
    for (const auto& m : sp["members"]) {
      devices.insert(m["device"].get<int>());
      holders.push_back(fmt::format("{}.{}", m["device"].get<int>(), m["replica"].get<int>()));
    }
    if (!printed.insert({sp["stage"].get<int>(), devices}).second) continue;
    for (const auto& l : sp["load"]) loads.push_back(fmt::format("{:.1f}", l.get<double>()));
    fmt::print("stage {} (holders device.replica {}): {} inversion pieces inverted by one holder and broadcast, {} "
               "by every holder; modelled inversion time per holder {} ms\n",
               sp["stage"].get<int>(), fmt::join(holders, ", "), sp["communicated"].get<int>(),
               sp["non_communicated"].get<int>(), fmt::join(loads, ", "));
  }
}

void print_kfac(const nlohmann::json& k) {
  // The bound is what the bubbles alone allow: a device refreshing in fewer steps than its bound
  // runs the rest of its work inline (lengthening a step), which is the planner's choice to make.
  const std::string bounds = lower_bound_text(k["lower_bound_refresh_steps"]);
  fmt::print("PipeFisher ({} model shapes, margin {:g}, W={}): refresh steps per device {}; its bubbles alone "
             "would need at least {} (K-FAC work / bubble per step, rounded up{}), a device refreshing sooner runs "
             "the rest inline; inline work on the critical path {:.3f} per refresh; step time with K-FAC {:.3f} (the refresh "
             "period's mean, precondition included), utilization {:.1f}% over the refresh period\n",
             k["model"].get<std::string>(), k["margin"].get<double>(), k["data_parallel"].get<int>(),
             k["refresh_steps"].dump(), bounds, bounds.find('-') != std::string::npos ? "; -: no bubble" : "",
             k["inline_time"].get<double>(), k["step_time"].get<double>(), 100 * k["utilization"].get<double>());
  if (!k["splits"].empty())
    fmt::print("{} inversions split into diagonal blocks (block-diagonal factor: larger than every bubble, or "
               "shortening the refresh period)\n",
               k["splits"].size());
  if (k.contains("weight_gradients")) fmt::print("{}\n", k["weight_gradients"]["line"].get<std::string>());
  print_placements(k["placement"]);
  fmt::print("{}\n\n{}", k["precondition_line"].get<std::string>(), k["timeline_text"].get<std::string>());
}

}  // namespace pf::app
