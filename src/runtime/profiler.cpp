#include "runtime/profiler.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "runtime/plan_record.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "sim/memory.hpp"
#include "viz/render.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>
#include <type_traits>

namespace pf {

namespace {

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool is_wait(Kind k) { return k == Kind::RECV_F || k == Kind::RECV_B || k == Kind::ALLREDUCE; }

}  // namespace

Timeline measured_timeline(const Layout& layout, const std::vector<std::vector<ActionTime>>& per_rank) {
  std::vector<std::vector<Action>> actions;
  for (size_t r = 0; r < per_rank.size(); ++r) actions.push_back(layout.schedule.per_device[r % layout.devices]);
  return measured_timeline(actions, per_rank);
}

Timeline measured_timeline(const std::vector<std::vector<Action>>& per_rank_actions,
                           const std::vector<std::vector<ActionTime>>& per_rank) {
  const int ranks = static_cast<int>(per_rank.size());
  int64_t t0 = INT64_MAX;
  for (const auto& r : per_rank)
    for (const ActionTime& t : r) t0 = std::min(t0, t.start);
  Timeline tl;
  tl.per_device.resize(ranks);
  tl.busy.assign(ranks, 0);
  tl.peak_in_flight.assign(ranks, 0);
  for (int r = 0; r < ranks; ++r) {
    const auto& actions = per_rank_actions[r];
    PF_CHECK(actions.size() == per_rank[r].size(), "rank {} sent {} stamps for {} actions", r, per_rank[r].size(),
             actions.size());
    for (size_t i = 0; i < actions.size(); ++i) {
      const ActionTime& t = per_rank[r][i];
      // The wait inside an action (OPT finishing the gradients) shows as idle before it.
      const double start = static_cast<double>(t.start + t.wait - t0) / 1e6, end = static_cast<double>(t.end - t0) / 1e6;
      tl.per_device[r].push_back({actions[i], start, end, static_cast<int>(t.in_wait_of), static_cast<double>(t.taps) / 1e6});
      if (is_compute(actions[i].kind)) tl.busy[r] += end - start;
      tl.step_time = std::max(tl.step_time, end);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    tl.bubble.push_back(tl.step_time - tl.busy[r]);
    tl.utilization.push_back(tl.step_time > 0 ? tl.busy[r] / tl.step_time : 0);
  }
  return tl;
}

void check_profile_steps(const ProfileOptions& opt, int total_steps) {
  if (opt.dir.empty()) return;
  for (int s : opt.steps)
    if (s < 1 || s > total_steps) usage_error("--profile-steps", "step {} is outside the run's steps 1..{}", s, total_steps);
}

namespace {

// Collective over the pipeline: every stage's sizes (pipeline 0's copy, on one rank of it).
std::vector<StageBytes> gather_stage_bytes(int stages, const comm::Groups& groups, const Executor& exec) {
  const size_t S = static_cast<size_t>(stages);
  std::vector<double> v(3 * S, 0);  // [stage] params, then states, then deferred
  for (int s = 0; s < stages; ++s) v[s] = static_cast<double>(exec.stage_param_bytes(0, s));
  for (const ActivationMemory::Stage& st : exec.activation_memory().stages)
    if (st.pipeline == 0) {
      v[S + st.stage] = static_cast<double>(st.state_bytes);
      v[2 * S + st.stage] = static_cast<double>(st.deferred_bytes);
    }
  comm::allreduce_sum(v, groups.pipeline.get(), "the stages' parameter and activation sizes");
  std::vector<StageBytes> out(S);
  for (size_t s = 0; s < S; ++s)
    out[s] = {.params = static_cast<int64_t>(v[s]), .state = static_cast<int64_t>(v[S + s]),
              .deferred = static_cast<int64_t>(v[2 * S + s])};
  return out;
}

}  // namespace

Profiler::Profiler(const Config& cfg, const Layout& layout, const comm::Groups& groups, const Executor& exec,
                   const KfacLayerNames& kfac_layers, ProfileOptions opt)
    : cfg_(cfg), layout_(layout), groups_(groups), opt_(std::move(opt)), total_steps_(cfg.train.steps) {
  if (!enabled()) return;
  check_profile_steps(opt_, total_steps_);
  if (groups.rank == 0) make_dirs(opt_.dir, "--profile-dir");
  offsets_ = comm::estimate_clock_offsets(MPI_COMM_WORLD);
  stage_bytes_ = gather_stage_bytes(layout.stages(), groups, exec);
  // Every rank's K-FAC layer names to rank 0, one "pipeline stage layer name" line each.
  std::string mine;
  for (const auto& [p, st, l, name] : kfac_layers) mine += fmt::format("{} {} {} {}\n", p, st, l, name);
  for (const std::string& text : comm::gather_bytes(mine, 0, MPI_COMM_WORLD)) {
    std::istringstream in(text);
    int p = 0, st = 0, l = 0;
    std::string name;
    while (in >> p >> st >> l >> name) layer_names_[{p, st, l}] = name;
  }
}

bool Profiler::wants(int64_t step) const {
  if (!enabled()) return false;
  if (opt_.steps.empty()) return step > 0 || total_steps_ == 1;
  return opt_.steps.count(static_cast<int>(step) + 1) > 0;
}

void Profiler::record(int64_t step, const std::vector<ActionTime>& times) {
  record(step, times, layout_.schedule.per_device[groups_.stage]);
}

namespace {

// One rank's part of a profiled step, as it travels to rank 0 (every field trivially copyable).
struct RankStep {
  std::vector<ActionTime> times;
  std::vector<Action> actions;
  std::vector<TimedAction> planned;
};

template <class T>
void append(std::string& out, const std::vector<T>& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const uint64_t n = v.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(v.data()), n * sizeof(T));
}

template <class T>
std::vector<T> take(const std::string& in, size_t& at) {
  uint64_t n = 0;
  PF_CHECK(at + sizeof n <= in.size(), "a profiled step's record is cut short");
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  PF_CHECK(n <= (in.size() - at) / sizeof(T), "a profiled step's record is cut short");
  std::vector<T> v(n);
  std::memcpy(v.data(), in.data() + at, n * sizeof(T));
  at += n * sizeof(T);
  return v;
}

RankStep unpack(const std::string& in) {
  size_t at = 0;
  RankStep r;
  r.times = take<ActionTime>(in, at);
  r.actions = take<Action>(in, at);
  r.planned = take<TimedAction>(in, at);
  return r;
}

}  // namespace

void Profiler::record(int64_t step, const std::vector<ActionTime>& times, const std::vector<Action>& actions,
                      const std::vector<TimedAction>& planned) {
  PF_CHECK(times.size() == actions.size(), "{} stamps for {} actions", times.size(), actions.size());
  std::string mine;
  append(mine, times);
  append(mine, actions);
  append(mine, planned);
  std::vector<std::string> all = comm::gather_bytes(mine, 0, MPI_COMM_WORLD);
  if (groups_.rank != 0) return;
  std::vector<std::vector<ActionTime>> per_rank(all.size());
  std::vector<std::vector<Action>> per_rank_actions(all.size());
  std::vector<std::vector<TimedAction>> per_rank_planned(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    RankStep rs = unpack(all[r]);
    per_rank[r] = std::move(rs.times);
    per_rank_actions[r] = std::move(rs.actions);
    per_rank_planned[r] = std::move(rs.planned);
    for (ActionTime& t : per_rank[r]) t.start -= offsets_.offset_ns[r], t.end -= offsets_.offset_ns[r];
  }
  MeasuredStep m;
  m.step = static_cast<int>(step) + 1;
  int64_t t0 = INT64_MAX;  // where measured_timeline puts 0
  for (const auto& r : per_rank)
    for (const ActionTime& t : r) t0 = std::min(t0, t.start);
  if (origin_ns_ < 0) origin_ns_ = t0;
  m.start = static_cast<double>(t0 - origin_ns_) / 1e6;
  m.timeline = measured_timeline(per_rank_actions, per_rank);
  m.planned = std::move(per_rank_planned);
  for (size_t r = 0; r < per_rank.size(); ++r) {
    double w = 0;
    for (const TimedAction& t : m.timeline.per_device[r]) w += is_wait(t.action.kind) ? t.end - t.start : 0;
    for (const ActionTime& t : per_rank[r]) w += static_cast<double>(t.wait) / 1e6;
    m.comm_wait.push_back(w);
  }
  const Schedule& s = layout_.schedule;
  const std::string title = fmt::format("measured {} D={} W={} N={} step {}", s.name, layout_.devices,
                                        layout_.replicas, s.micro_batches, m.step);
  SvgOptions svg;
  svg.title = title;
  svg.steps = 1;
  svg.first_step = m.step;
  write_output({fmt::format("{}/timeline-step{}.svg", opt_.dir, m.step), "--profile-dir"},
               timeline_svg(m.timeline, svg));
  measured_.push_back(std::move(m));
  raw_.push_back(std::move(per_rank));
}

// Step times, and utilization and communication wait per rank averaged over the profiled steps.
struct StepSummary {
  std::vector<double> step_ms, utilization, comm_wait;
  nlohmann::json steps = nlohmann::json::array();  // their 1-based numbers
};

namespace {

// One stage's measured action durations (ms), over every profiled step and micro-batch.
struct StageSamples {
  std::vector<double> forward, backward, input_grad, weight_grad, optimizer, allreduce;
};

struct Samples {
  std::vector<StageSamples> stage;  // [stage]
  std::vector<double> p2p;          // message delays (ms)
};

// A message: (0 forward / 1 backward, pipeline, consumer stage, micro-batch, replica).
using MessageKey = std::tuple<int, int, int, int, int>;

// Files each compute action's duration under its stage; returns when each message was sent (ms).
std::map<MessageKey, double> sort_durations(const Timeline& tl, int devices, Samples& out) {
  std::map<MessageKey, double> sent;
  for (size_t r = 0; r < tl.per_device.size(); ++r)
    for (const TimedAction& t : tl.per_device[r]) {
      const Action& a = t.action;
      const double d = t.end - t.start;
      const int rep = static_cast<int>(r) / devices;
      StageSamples& st = out.stage[a.stage];
      switch (a.kind) {
        case Kind::F: st.forward.push_back(d); break;
        case Kind::B: st.backward.push_back(d); break;
        case Kind::I: st.input_grad.push_back(d); break;
        case Kind::W: st.weight_grad.push_back(d); break;
        case Kind::OPT: st.optimizer.push_back(d); break;
        case Kind::ALLREDUCE: st.allreduce.push_back(d); break;
        case Kind::SEND_F: sent[{0, a.pipeline, a.stage + 1, a.micro_batch, rep}] = t.start; break;
        case Kind::SEND_B: sent[{1, a.pipeline, a.stage - 1, a.micro_batch, rep}] = t.start; break;
        default: break;
      }
    }
  return sent;
}

// Transfer latency: a receive that was already waiting when the send started ends one message
// delay after it.
void add_p2p_latencies(const Timeline& tl, int devices, const std::map<MessageKey, double>& sent, Samples& out) {
  for (size_t r = 0; r < tl.per_device.size(); ++r)
    for (const TimedAction& t : tl.per_device[r]) {
      const Action& a = t.action;
      if (a.kind != Kind::RECV_F && a.kind != Kind::RECV_B) continue;
      auto it = sent.find({a.kind == Kind::RECV_F ? 0 : 1, a.pipeline, a.stage, a.micro_batch,
                           static_cast<int>(r) / devices});
      if (it != sent.end() && t.start <= it->second) out.p2p.push_back(std::max(0.0, t.end - it->second));
    }
}

Samples collect_samples(const std::vector<MeasuredStep>& measured, int stages, int devices) {
  Samples out;
  out.stage.resize(stages);
  for (const MeasuredStep& m : measured)
    add_p2p_latencies(m.timeline, devices, sort_durations(m.timeline, devices, out), out);
  return out;
}

// Finishing the gradients (first OPT of a device: all-reduces, word-embedding sum, norm) is drawn
// as a wait; its own cost is what the last rank to arrive waited (it waited for no one), and it is
// charged to the stage of each device's first OPT.
std::vector<bool> first_opt_stages(const Schedule& schedule, int stages, int devices) {
  std::vector<bool> first(stages, false);
  for (int d = 0; d < devices; ++d)
    for (const Action& a : schedule.per_device[d])
      if (a.kind == Kind::OPT) {
        first[a.stage] = true;
        break;
      }
  return first;
}

// [profiled step] the least wait any rank's action had in that step (ms); steps without waits
// are left out.
std::vector<double> finishing_times(const std::vector<std::vector<std::vector<ActionTime>>>& raw) {
  std::vector<double> finish;
  for (const auto& step : raw) {
    double least = -1;
    for (size_t r = 0; r < step.size(); ++r)
      for (const ActionTime& t : step[r])
        if (t.wait > 0) least = least < 0 ? t.wait / 1e6 : std::min(least, t.wait / 1e6);
    if (least >= 0) finish.push_back(least);
  }
  return finish;
}

StageCost stage_cost(const StageSamples& m, double finishing, double activation_bytes, double grad_bytes) {
  StageCost c;
  c.forward = mean(m.forward);
  c.backward = m.backward.empty() ? mean(m.input_grad) + mean(m.weight_grad) : mean(m.backward);
  c.optimizer = mean(m.optimizer) + finishing;
  c.activation_bytes = activation_bytes;
  c.grad_bytes = grad_bytes;
  if (!m.input_grad.empty()) {
    c.input_grad = mean(m.input_grad);
    c.weight_grad = mean(m.weight_grad);
  }
  return c;
}

StepSummary summarize(const std::vector<MeasuredStep>& measured) {
  StepSummary out;
  out.utilization.assign(measured.front().timeline.utilization.size(), 0);
  out.comm_wait.assign(measured.front().comm_wait.size(), 0);
  for (const MeasuredStep& m : measured) {
    out.step_ms.push_back(m.timeline.step_time);
    out.steps.push_back(m.step);
    for (size_t r = 0; r < out.utilization.size(); ++r) {
      out.utilization[r] += m.timeline.utilization[r] / static_cast<double>(measured.size());
      out.comm_wait[r] += m.comm_wait[r] / static_cast<double>(measured.size());
    }
  }
  return out;
}

}  // namespace

nlohmann::json Profiler::stage_json(int s, const StageCost& c, bool split_backward) const {
  using nlohmann::json;
  const BlockRange& blocks = layout_.stage_blocks[s];
  const StageMemory mem = block_memory(cfg_.model, blocks.last - blocks.first + 1, cfg_.parallel.micro_batch_size);
  const StageBytes& held = stage_bytes_[s];  // the executor's own, so the model's peak is the runtime's
  json j = {{"forward", c.forward}, {"backward", c.backward}, {"optimizer", c.optimizer},
            {"layers", 1}, {"activation_bytes", c.activation_bytes}, {"grad_bytes", c.grad_bytes},
            {"mem_param", mem.param}, {"mem_act", held.state / kBytesPerMB}, {"mem_peak_err", mem.err_peak},
            {"mem_save_err", mem.err_save}, {"mem_kron", mem.kron}, {"mem_deferred", held.deferred / kBytesPerMB}};
  if (split_backward) {
    j["input_grad"] = c.input_grad;
    j["weight_grad"] = c.weight_grad;
  }
  return j;
}

void Profiler::finish(const PlanProfile* plan) {
  if (!enabled() || groups_.rank != 0 || measured_.empty()) return;
  const int S = layout_.stages(), D = layout_.devices;
  const Samples samples = collect_samples(measured_, S, D);
  const std::vector<bool> first_opt = first_opt_stages(layout_.schedule, S, D);
  const std::vector<double> finishing = finishing_times(raw_);
  const ModelConfig& mc = cfg_.model;
  const double act_bytes = 4.0 * cfg_.parallel.micro_batch_size * mc.seq_len * mc.hidden;
  nlohmann::json stages = nlohmann::json::array();
  CostModel cost;
  cost.stages.clear();
  std::vector<double> all_ar;
  for (int s = 0; s < S; ++s) {
    const StageSamples& m = samples.stage[s];
    const StageCost c = stage_cost(m, first_opt[s] ? mean(finishing) : 0.0, act_bytes,
                                   static_cast<double>(stage_bytes_[s].params));
    cost.stages.push_back(c);
    stages.push_back(stage_json(s, c, !m.input_grad.empty()));
    all_ar.insert(all_ar.end(), m.allreduce.begin(), m.allreduce.end());
  }
  cost.p2p_latency = median(samples.p2p);
  cost.allreduce_alpha = mean(all_ar);
  const Timeline predicted = simulate(layout_.schedule, cost);
  const StepSummary summary = summarize(measured_);
  const double measured_step = mean(summary.step_ms);
  nlohmann::json j = profile_json(stages, cost, summary, samples.p2p.size(), predicted);
  if (plan) {  // the units the plan was made from, named as pipeline 0's layers
    std::vector<std::vector<std::string>> names(S);
    for (const auto& [at, name] : layer_names_) {
      const auto [pipeline, stage, layer] = at;
      if (pipeline != 0) continue;
      names[stage].resize(std::max<size_t>(names[stage].size(), layer + 1));
      names[stage][layer] = name;
    }
    add_plan_profile(j, *plan, names);
  }
  write_output({opt_.dir + "/profile.json", "--profile-dir"}, j.dump(1) + "\n");
  write_trace();
  std::string u;
  for (double x : summary.utilization) u += fmt::format("{}{:.0f}%", u.empty() ? "" : " ", 100 * x);
  std::printf("profile: measured step %.2f ms (utilization per rank %s, mean comm wait %.2f ms), simulator with "
              "this profile predicts %.2f ms; %s/{profile.json, timeline-step*.svg, trace.json}\n",
              measured_step, u.c_str(), mean(summary.comm_wait), predicted.step_time, opt_.dir.c_str());
  const std::string note = chimera_order_note(cfg_, D, layout_.micro_batches, cost);
  if (!note.empty()) std::printf("profile: %s\n", note.c_str());
  std::fflush(stdout);
}

nlohmann::json Profiler::profile_json(const nlohmann::json& stages, const CostModel& cost, const StepSummary& summary,
                                      size_t p2p_samples, const Timeline& predicted) const {
  const int D = layout_.devices;
  const Schedule& sched = layout_.schedule;
  nlohmann::json j = {
      {"format", "pipefisher-profile"},
      {"version", 1},
      {"micro_batch_size", cfg_.parallel.micro_batch_size},
      {"stages", stages},
      {"p2p", {{"latency", cost.p2p_latency}, {"bandwidth", 0}}},
      {"allreduce", {{"alpha", cost.allreduce_alpha}, {"beta", 0}}},
      {"measured",
       {{"schedule", sched.name}, {"devices", D}, {"replicas", layout_.replicas},
        {"micro_batches", layout_.micro_batches}, {"steps", summary.steps}, {"time_unit", "ms"},
        {"step_time", mean(summary.step_ms)}, {"step_times", summary.step_ms}, {"utilization", summary.utilization},
        {"comm_wait", summary.comm_wait}, {"p2p_samples", p2p_samples},
        {"predicted_step_time", predicted.step_time},
        {"predicted_utilization", predicted.utilization}}}};
  j["run"] = profile_run(cfg_, layout_);
  return j;
}

void Profiler::write_trace() const {
  const Schedule& sched = layout_.schedule;
  std::vector<TraceStep> trace;
  for (const MeasuredStep& m : measured_)
    trace.push_back({.step = m.step, .start = m.start, .timeline = &m.timeline, .planned = &m.planned});
  write_output({opt_.dir + "/trace.json", "--profile-dir"},
               chrome_trace(trace, fmt::format("measured {} D={} W={} N={}", sched.name, layout_.devices,
                                               layout_.replicas, sched.micro_batches), layer_names_));
}

std::string chimera_order_note(const Config& cfg, int devices, int micro_batches, const CostModel& cost) {
  if (cfg.parallel.schedule != ScheduleName::Chimera || !cfg.parallel.schedule_file.empty()) return "";
  const double used = cfg.parallel.backward_forward_ratio, measured = cost.backward_forward_ratio();
  if (to_text(make_chimera(devices, micro_batches, 1, used)) == to_text(make_chimera(devices, micro_batches, 1, measured)))
    return "";
  return fmt::format("Chimera was ordered for T_b / T_f = {}; this run measured {:.3g}, whose order differs "
                     "(parallel.backward_forward_ratio = {:.3g} gives it)", used, measured, measured);
}

}  // namespace pf
