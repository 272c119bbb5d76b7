// SOAP's eigenbasis refreshes in the pipeline's bubbles (soap_placement.hpp): the profile, the
// plan, the planned steps and the record of what ran.
#include "runtime/soap/soap_placement.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "plan/planned_row.hpp"
#include "runtime/pipefisher/plan_source.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace pf {

namespace {

Soap& soap_of(const HostedChunk& c) {
  auto* soap = dynamic_cast<Soap*>(c.optim.get());
  PF_CHECK(soap, "stage {}: SOAP's placement over a {} optimizer", c.stage, c.optim->name());
  return *soap;
}

// The STATs of the base step, and those in a bubble: a pass follows them on their device.
std::pair<int, int> statistics_in_bubbles(const KfacPlan& p) {
  int in_bubble = 0, all = 0;
  for (const std::vector<TimedAction>& row : p.base.per_device) {
    bool seen_pass = false;
    for (size_t i = row.size(); i-- > 0;) {
      seen_pass |= is_pass(row[i].action.kind);
      if (row[i].action.kind == Kind::STAT) ++all, in_bubble += seen_pass;
    }
  }
  return {in_bubble, all};
}

// The plan's lines on stdout (rank 0); units counted on one replica (replicas refresh alike).
void print_plan(const KfacPlan& p, const std::string& from) {
  int inline_units = 0, units = 0;
  for (const PlacedUnit& u : p.units())
    if (u.replica == 0) inline_units += u.inline_work, ++units;
  const auto [stats_in_bubbles, stats] = statistics_in_bubbles(p);
  std::printf("soap: planned from %s: eigenbasis refreshes every %s steps (per device), %d of %d "
              "refreshes inline (%.3f ms per cycle), statistics of %d of %d weights in a bubble, utilization %.0f%%, "
              "step %.2f ms (%.2f ms without SOAP's statistics and refreshes)\n",
              from.c_str(), fmt::format("{}", fmt::join(p.refresh_steps, " ")).c_str(), inline_units,
              units, p.inline_time, stats_in_bubbles, stats, 100 * p.utilization, p.step_time, p.plain_step_time);
  std::fflush(stdout);
}

}  // namespace

SoapPlacement::SoapPlacement(const Config& cfg, const Layout& layout, const comm::Groups& groups, HostedChunks& chunks,
                             double cost_scale)
    : settings_{.work = BubbleWork::soap,
                .replicas = layout.replicas,
                .recompute = cfg.parallel.recompute && layout.stages() > 1,
                .min_refresh_steps = std::max(cfg.kfac.min_refresh_steps, cfg.optim.soap.precondition_frequency)},
      layout_(layout),
      groups_(groups),
      chunks_(chunks),
      scale_(cost_scale),
      device_(groups.stage),
      lowered_(layout.schedule.per_device.at(groups.stage)),
      action_ms_(lowered_.size(), 0.0),
      plan_start_(kProfileSteps),
      record_run_(plan_record_run(cfg, layout)),
      out_dir_(cfg.train.out_dir) {
  for (HostedChunk& c : chunks_) soap_of(c).refresh_by_units(true);
  if (!cfg.kfac.plan_profile.empty()) {
    recorded_ = read_plan_profile(cfg, layout);
    recorded_path_ = cfg.kfac.plan_profile;
    check_recorded_weights();
  }
}

// Collective: UsageError naming precond.plan_profile on every rank when a hosted chunk rotates
// another number of weights than the recorded profile gives its stage.
void SoapPlacement::check_recorded_weights() const {
  double wrong = 0;
  for (const HostedChunk& c : chunks_)
    wrong += Soap::rotated_weights(c.params).size() != recorded_->kfac.at(static_cast<size_t>(c.stage)).eig_l.size();
  comm::allreduce_sum(std::span<double>(&wrong, 1), MPI_COMM_WORLD, "the recorded SOAP profile's check");
  if (wrong > 0)
    usage_error("kfac.plan_profile", "'{}': its stages' rotated weights are not this model's (another partition "
                "or model)", recorded_path_);
}

const std::vector<Action>& SoapPlacement::actions_for(int64_t step) const {
  if (step < plan_start_) return lowered_;
  return plan_->actions(groups_.replica, device_, step - plan_start_);
}

// The profiling steps need their stamps; the planned ones do not. From the first planned step on,
// each update's statistics wait for the next step's STAT.
bool SoapPlacement::begin_step(int64_t step, const std::vector<MicroBatch>&) {
  for (HostedChunk& c : chunks_) soap_of(c).defer_statistics(step >= plan_start_);
  return step < plan_start_;
}

void SoapPlacement::after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (step >= plan_start_) {
    if (groups_.replica == 0)  // replicas refresh alike, and so do Chimera's twins (the plan aligns them)
      for (const Action& a : list)
        if (is_eigenbasis(a.kind) && a.pipeline == 0) {
          const HostedChunk& c = chunks_.at(a.pipeline, a.stage);
          const int w = Soap::rotated_weights(c.params).at(static_cast<size_t>(a.layer));
          if (soap_of(c).has_factor(a.layer, side_index(a.kind)))
            refreshes_.push_back({step, c.params[static_cast<size_t>(w)]->name, side_index(a.kind)});
        }
    return;
  }
  PF_CHECK(times.size() == lowered_.size(), "profiled step {}: {} times for {} actions", step, times.size(), lowered_.size());
  for (size_t i = 0; i < times.size(); ++i)
    action_ms_[i] += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  ++samples_;
  if (step + 1 == plan_start_) make_plan();
}

// Every rank's times in one all-reduce, so every rank plans from the same bits: per device its
// passes (at their kind's median) and optimizer steps, the mean over its replicas; per stage each
// rotated weight's two refreshes and the stage's statistics, timed on copies, the mean over the
// stage's holders.
PlanProfile SoapPlacement::measured_profile() const {
  const int S = layout_.stages(), D = layout_.devices, W = layout_.replicas;
  std::vector<double> counts(2 * static_cast<size_t>(S), 0.0);  // [stage] holders, rotated weights
  for (const HostedChunk& c : chunks_)
    counts[2 * c.stage] += 1, counts[2 * c.stage + 1] += static_cast<double>(Soap::rotated_weights(c.params).size());
  comm::allreduce_sum(counts, MPI_COMM_WORLD, "SOAP's weights per stage");
  size_t lmax = 1;
  for (int s = 0; s < S; ++s) lmax = std::max(lmax, static_cast<size_t>(counts[2 * s + 1] / std::max(1.0, counts[2 * s])));
  std::vector<size_t> off(static_cast<size_t>(D) + 1, 0);
  for (int d = 0; d < D; ++d) off[d + 1] = off[d] + layout_.schedule.per_device[d].size();
  std::vector<double> wire(off[D] + static_cast<size_t>(S) * 3 * lmax, 0.0);  // per stage: EIG_L, EIG_R, STAT
  std::vector<double> mine(lowered_.size(), 0.0);
  for (size_t i = 0; i < lowered_.size(); ++i)
    if (planner_measures(lowered_[i].kind)) mine[i] = action_ms_[i] / std::max(1, samples_) / W;
  passes_at_their_median(lowered_, mine);
  std::copy(mine.begin(), mine.end(), wire.begin() + static_cast<std::ptrdiff_t>(off[device_]));
  for (const HostedChunk& c : chunks_) {
    Soap& soap = soap_of(c);
    const size_t at = off[D] + static_cast<size_t>(c.stage) * 3 * lmax;
    for (size_t w = 0; w < Soap::rotated_weights(c.params).size(); ++w) {
      for (int side : {0, 1})
        if (soap.has_factor(static_cast<int>(w), side))
          wire[at + side * lmax + w] += soap.time_refresh_factor(static_cast<int>(w), side) / counts[2 * c.stage];
      wire[at + 2 * lmax + w] += soap.time_statistics(static_cast<int>(w)) / counts[2 * c.stage];
    }
  }
  comm::allreduce_sum(wire, MPI_COMM_WORLD, "SOAP's profile");
  PlanProfile profile;
  profile.shape = record_run_.shape;
  profile.action_ms.assign(static_cast<size_t>(D), {});
  for (int d = 0; d < D; ++d) profile.action_ms[d].assign(wire.begin() + off[d], wire.begin() + off[d + 1]);
  std::vector<StageKfacCost>& stages = profile.kfac;
  stages.assign(static_cast<size_t>(S), {});
  for (int s = 0; s < S; ++s) {
    const auto n = static_cast<size_t>(counts[2 * s + 1] / std::max(1.0, counts[2 * s]));
    const auto at = static_cast<std::ptrdiff_t>(off[D] + static_cast<size_t>(s) * 3 * lmax);
    const auto l = static_cast<std::ptrdiff_t>(lmax), m = static_cast<std::ptrdiff_t>(n);
    stages[s].eig_l.assign(wire.begin() + at, wire.begin() + at + m);
    stages[s].eig_r.assign(wire.begin() + at + l, wire.begin() + at + l + m);
    stages[s].statistics.assign(wire.begin() + at + 2 * l, wire.begin() + at + 2 * l + m);
  }
  return profile;
}

// Collective: the profile all-reduced (or precond.plan_profile's, the same on every rank), then
// the same plan on every rank; rank 0 writes the profile as out_dir/soap_profile.json.
void SoapPlacement::make_plan() {
  plan_from(recorded_ ? *recorded_ : measured_profile());
  if (groups_.rank == 0)  // out_dir exists: rank 0 made it before the first step
    write_file_atomic(out_dir_ + "/soap_profile.json", plan_profile_json(record_run_, layout_, profile_).dump(1) + "\n");
}

// The plan of a profile (measured, recorded, or a checkpoint's): the same bits from the same profile.
void SoapPlacement::plan_from(PlanProfile profile) {
  profile_ = std::move(profile);
  PlanInput in = plan_input(layout_.schedule, settings_, {0.0, 0.0}, profile_.kfac, scale_);
  in.durations = profile_.action_ms;
  plan_ = std::make_unique<KfacPlan>(plan_kfac(in));
  const std::string from = recorded_ ? fmt::format("precond.plan_profile = {}", recorded_path_)
                                     : fmt::format("steps 1-{}", plan_start_);
  if (groups_.rank == 0) print_plan(*plan_, from);
}

int SoapPlacement::plan_period() const {
  if (!plan_) return 0;
  int p = 1;
  for (int r : plan_->refresh_steps) p = std::lcm(p, std::max(r, 1));
  return p;
}

std::vector<TimedAction> SoapPlacement::planned_row(int64_t step) const {
  if (!plan_ || step < plan_start_) return {};
  return pf::planned_row(*plan_, groups_.replica, device_, step - plan_start_);
}

std::optional<PlanSummary> SoapPlacement::plan_summary() const {
  if (!plan_) return std::nullopt;
  return PlanSummary{.refresh_steps = plan_->refresh_steps, .soap = true, .step_ms = plan_->step_time,
                     .without_kfac_ms = plan_->plain_step_time, .precondition_only_ms = plan_->base_step_time,
                     .utilization = plan_->utilization};
}

void SoapPlacement::save_state(nlohmann::json& j) const {
  nlohmann::json s = {{"plan_start", plan_start_}, {"samples", samples_}, {"action_ms", action_ms_}};
  nlohmann::json refreshes = nlohmann::json::array(), eig = nlohmann::json::array();
  for (const SoapRefresh& r : refreshes_) refreshes.push_back({r.step, r.side, r.weight});
  s["refreshes"] = refreshes;
  if (plan_) {
    for (const StageKfacCost& c : profile_.kfac) eig.push_back({c.eig_l, c.eig_r, c.statistics});
    s["plan"] = {{"durations", profile_.action_ms}, {"eig", eig}};
  }
  j["soap"] = s;
}

void SoapPlacement::load_state(const nlohmann::json& j, const std::string& where, int64_t next_step) {
  if (!j.contains("soap"))
    usage_error("--resume", "{}: its SOAP state has no plan (written by a build that did not keep it); start the run again", where);
  const nlohmann::json& s = j.at("soap");
  plan_start_ = s.at("plan_start").get<int64_t>();
  samples_ = s.at("samples").get<int>();
  action_ms_ = s.at("action_ms").get<std::vector<double>>();
  if (action_ms_.size() != lowered_.size())
    usage_error("--resume", "{}: a profile of {} actions, this device runs {} (another layout or schedule)", where,
                action_ms_.size(), lowered_.size());
  refreshes_.clear();
  for (const auto& r : s.at("refreshes"))
    refreshes_.push_back({r.at(0).get<int64_t>(), r.at(2).get<std::string>(), r.at(1).get<int>()});
  if (!s.contains("plan")) {
    if (next_step >= plan_start_) usage_error("--resume", "{}: step {} is planned, and the checkpoint holds no plan", where, next_step);
    return;  // still profiling: the next profiled step plans
  }
  PlanProfile profile;
  profile.shape = record_run_.shape;
  std::vector<StageKfacCost>& stages = profile.kfac;
  for (const auto& e : s.at("plan").at("eig")) {
    if (e.size() < 3)
      usage_error("--resume", "{}: its SOAP plan has no statistics' cost (written by a build that planned without STAT); start the run again", where);
    StageKfacCost c;
    c.eig_l = e.at(0).get<std::vector<double>>(), c.eig_r = e.at(1).get<std::vector<double>>();
    c.statistics = e.at(2).get<std::vector<double>>();
    stages.push_back(std::move(c));
  }
  profile.action_ms = s.at("plan").at("durations").get<std::vector<std::vector<double>>>();
  plan_from(std::move(profile));
}

void SoapPlacement::write_refresh_record(const std::string& path, int64_t steps) const {
  std::string mine;
  for (const SoapRefresh& r : refreshes_) mine += fmt::format("{} {} {}\n", r.step, r.side, r.weight);
  const std::vector<std::string> all = comm::gather_bytes(mine, 0, MPI_COMM_WORLD);
  if (groups_.rank != 0) return;
  SoapRefreshRecord rec{steps, plan_start_, plan_period(), {}};
  for (const std::string& text : all) {
    std::istringstream in(text);
    SoapRefresh r;
    while (in >> r.step >> r.side >> r.weight) rec.refreshes.push_back(r);
  }
  write_soap_record(std::move(rec), path);
}

}  // namespace pf
