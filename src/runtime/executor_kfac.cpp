#include "runtime/executor.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "kfac/factor.hpp"
#include "kfac/kfac_layer.hpp"
#include "runtime/executor_parts.hpp"
#include "runtime/pipefisher.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

// PipeFisher's side of the executor (runtime/pipefisher.hpp): K-FAC set-up, the step's list
// (profiling, the plan, a drain), K-FAC actions, profiling and planning, drift (its records and
// checkpoints: executor_kfac_records.cpp).
namespace pf {

Executor::~Executor() = default;

void Executor::kfac_setup() {
  kfac_ = std::make_unique<KfacState>();
  KfacState& k = *kfac_;
  k.bubbles = cfg_.kfac.placement == Placement::Bubbles;
  if (k.bubbles && !cfg_.kfac.plan_profile.empty())
    k.recorded = read_plan_profile(cfg_, layout_, ProfileLayout(layout_).size);
  const int N = layout_.micro_batches;
  for (auto& c : chunks_) {
    k.chunk.push_back(std::make_unique<ChunkKfac>(*c->model, cfg_, groups_.replica, N, c->slot,
                                                  static_cast<int64_t>(cfg_.parallel.micro_batch_size) * cfg_.model.seq_len,
                                                  layout_.pipelines() > 1));
    c->kfac = k.chunk.back().get();
    k.times.emplace_back();
  }
  // Factor sums among a stage's copies get their own communicators (another stream of
  // collectives than the gradient buckets), made in stage order on every member.
  // inline / skip: the DistributedKfac's inverse broadcasts get a third stream.
  k.holders.resize(chunks_.size());
  k.inverse_comms.resize(chunks_.size());
  k.prec_comms.resize(chunks_.size());
  if (layout_.grad_sync) {
    std::vector<size_t> order(chunks_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return chunks_[a]->stage < chunks_[b]->stage; });
    auto dup = [](MPI_Comm base) {
      MPI_Comm d = MPI_COMM_NULL;
      comm::check(MPI_Comm_dup(base, &d), "MPI_Comm_dup(kfac holders)");
      return comm::Comm(d);
    };
    for (size_t i : order) {
      MPI_Comm base = layout_.pipelines() > 1 ? groups_.holders_comm(chunks_[i]->stage) : groups_.data_parallel.get();
      k.holders[i] = dup(base);
      (k.bubbles ? k.prec_comms : k.inverse_comms)[i] = dup(base);
    }
    if (!k.bubbles) kfac_setup_distributed();
  }
  // Inline list: each chunk's PREC (in stage order: their factor sums are blocking collectives)
  // just before the device's first OPT.
  size_t first_opt = actions_.size();
  for (size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind == Kind::OPT) {
      first_opt = i;
      break;
    }
  std::vector<Chunk*> by_stage;
  for (auto& c : chunks_) by_stage.push_back(c.get());
  std::sort(by_stage.begin(), by_stage.end(), [](Chunk* a, Chunk* b) { return a->stage < b->stage; });
  for (size_t i = 0; i <= actions_.size(); ++i) {
    if (i == first_opt)
      for (Chunk* c : by_stage) k.inline_list.push_back({Kind::PREC, c->stage, c->pipeline, -1, -1}), k.lowered_index.push_back(-1);
    if (i < actions_.size()) k.inline_list.push_back(actions_[i]), k.lowered_index.push_back(static_cast<int>(i));
  }
  k.dur_sum.assign(actions_.size(), 0.0);
}

const std::vector<Action>& Executor::step_actions(int64_t step) const {
  if (!kfac_) return actions_;
  const KfacState& k = *kfac_;
  if (k.replan_at >= 0 && step == k.replan_at) return k.reprofile_first;
  if (k.profiling(step)) return k.inline_list;
  if (k.draining(step)) return step == k.boundary ? k.drain_first : k.drain_plain;
  return k.plan->actions(groups_.replica, device_, step - k.plan_start);
}

bool Executor::kfac_begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  KfacState& k = *kfac_;
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  for (size_t i = 0; i < k.chunk.size(); ++i) {
    ChunkKfac* ck = k.chunk[i].get();
    if (!k.bubbles) {
      const bool curvature = ck->pre().curvature_step(step);
      ck->begin_step(step, false, curvature, scale);
      // The DistributedKfac marks a factor complete at its chunk's last micro-batch of the step.
      if (curvature && !k.dist.empty())
        k.dist[i]->begin_step(mbs.at(static_cast<size_t>(groups_.replica) * layout_.micro_batches +
                                     chunks_[i]->last_backward_mb).index);
    } else if (k.profiling(step)) {
      ck->begin_step(step, true, false, scale);  // profiling: save, then timed units at PREC
    } else if (k.draining(step)) {
      ck->begin_step(step, false, false, scale);  // no new cycle before re-profiling
    } else {
      const int R = k.plan->refresh_steps.at(device_);
      ck->begin_step(step, (step - k.plan_start) % R == 0, false, scale);
    }
  }
  return k.bubbles;  // stamps: profiling, and the drift check
}

bool Executor::kfac_action(const Action& a) {
  if (!kfac_) return false;
  size_t i = 0;
  while (i < chunks_.size() && !(chunks_[i]->pipeline == a.pipeline && chunks_[i]->stage == a.stage)) ++i;
  PF_CHECK(i < chunks_.size(), "device {} does not host stage {} of pipeline {}", device_, a.stage, a.pipeline);
  ChunkKfac& ck = *kfac_->chunk[i];
  switch (a.kind) {
    case Kind::CURV_A: ck.curvature(Side::A, a.layer, a.micro_batch); return ++kfac_curv_, true;
    case Kind::CURV_B: ck.curvature(Side::B, a.layer, a.micro_batch); return ++kfac_curv_, true;
    case Kind::INV_A: ck.invert(Side::A, a.layer, a.block); return ++kfac_inv_, true;
    case Kind::INV_B: ck.invert(Side::B, a.layer, a.block); return ++kfac_inv_, true;
    case Kind::PREC: kfac_precondition(*chunks_[i], i); return true;
    case Kind::SYNC_CURV: ck.sync(step_); return true;
    case Kind::BCAST_INV_A:
    case Kind::BCAST_INV_B: {
      // The holder that inverted the piece (a replica, or Chimera's twin of some replica) sends it.
      const auto owner = kfac_->plan->inverter(a);
      PF_CHECK(owner.has_value(), "{}: a broadcast of a piece every holder inverts", to_token(a));
      ck.broadcast(a.kind == Kind::BCAST_INV_A ? Side::A : Side::B, a.layer, a.block,
                   groups_.world_rank(owner->first, owner->second));
      return true;
    }
    default: return false;
  }
}

void Executor::kfac_precondition(Chunk& c, size_t index) {
  KfacState& k = *kfac_;
  ChunkKfac& ck = *k.chunk[index];
  if (ck.preconditioned()) return;
  if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;  // precondition the summed gradient
  MPI_Comm holders = k.holders[index].get();
  // An inline refresh's work counts one unit per K-FAC layer of the chunk (StepOutcome).
  const int layers = static_cast<int>(ck.pre().size());
  if (!k.bubbles) {
    const bool curv = ck.pre().curvature_step(step_), inv = ck.pre().inversion_step(step_);
    ck.inline_refresh(step_, curv, inv, holders, nullptr);
    kfac_curv_ += curv ? layers : 0;
    kfac_inv_ += inv ? layers : 0;
  } else if (k.profiling(step_)) {
    ck.set_replicated(MPI_COMM_NULL);  // re-profiling: inline, as at the start (pending inverses dropped)
    ck.set_prec_split({}, MPI_COMM_NULL);  // every layer: the plan needs the whole stage's time
    ck.inline_refresh(step_, true, true, holders, &k.times[index]);
    kfac_curv_ += layers;
    kfac_inv_ += layers;
  } else {
    ck.precondition(step_);
  }
}

void Executor::kfac_end_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  KfacState& k = *kfac_;
  if (!k.bubbles) return;
  if (!k.profiling(step)) {
    // A recorded profile fixes the plan: no re-plan from this run's timings.
    if (k.replan_at < 0 && cfg_.kfac.replan_on_drift && k.recorded.empty()) {
      double compute = 0;
      for (size_t i = 0; i < list.size() && i < times.size(); ++i) {
        const Kind kd = list[i].kind;
        if (kd == Kind::F || kd == Kind::B || kd == Kind::I || kd == Kind::W)
          compute += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
      }
      kfac_drift(step, compute);
    }
    return;
  }
  if (step == k.profile_start) {  // a fresh profile
    std::fill(k.dur_sum.begin(), k.dur_sum.end(), 0.0);
    k.dur_samples = 0;
    for (ChunkKfacTimes& t : k.times) t = {};
  }
  // The inline list ends the step's list; the first step of a re-profile may start with the old
  // cycle's wrapped units (kfac_drain_lists), which are not part of the profile.
  PF_CHECK(list.size() >= k.lowered_index.size() && times.size() == list.size(),
           "profiled step {}: {} actions, {} times, inline list of {}", step, list.size(), times.size(),
           k.lowered_index.size());
  const size_t skip = list.size() - k.lowered_index.size();
  for (size_t i = skip; i < list.size(); ++i) {
    const int j = k.lowered_index[i - skip];
    if (j >= 0) k.dur_sum[j] += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  }
  ++k.dur_samples;
  if (step + 1 == k.profile_start + kProfileSteps) {
    k.plan_start = step + 1;
    k.replan_at = -1;
    kfac_plan();
  }
}

// Drift: this rank's forward/backward time of a step (the durations the plan was made from;
// the whole step also counts waits, which the plan does not model) over 1.3x its profile for 3
// steps on any rank means the durations no longer match the profile. The decision is collective (every rank must switch at the same
// step): each device finishes its current cycle (its boundary), runs plain steps until the last
// device's boundary, then all re-profile (kProfileSteps inline steps) and re-plan.
// Tests only: --test-drift-at counts three steps as 10x their measured time.
void Executor::kfac_drift(int64_t step, double ms) {
  KfacState& k = *kfac_;
  if (kfac_seams_.drifts(step)) ms *= 10;
  const double planned = k.profiled_compute;
  // Over 30% and over 1 ms: scheduler noise on a tiny step is not drift.
  k.drift_steps = ms > 1.3 * planned && ms > planned + 1.0 ? k.drift_steps + 1 : 0;
  double flag = k.drift_steps >= 3 ? 1 : 0;
  comm::allreduce_sum({&flag, 1}, MPI_COMM_WORLD, "the drift decision");
  if (flag == 0) return;
  k.drift_steps = 0;
  const KfacPlan& p = *k.plan;
  const int64_t next = step + 1 - k.plan_start;  // plan step of the next training step
  auto boundary = [&](int d) {
    const int64_t R = p.refresh_steps[d];
    return k.plan_start + (next + R - 1) / R * R;
  };
  k.replan_at = 0;
  for (int d = 0; d < p.devices; ++d) k.replan_at = std::max(k.replan_at, boundary(d));
  k.boundary = boundary(device_);
  kfac_drain_lists();
  if (groups_.rank == 0) {
    std::printf("pipefisher: step %lld: forward/backward %.1f ms, over 30%% above the profiled %.1f ms for 3 steps "
                "(on some rank): durations drifted; re-profiling from step %lld and re-planning\n",
                static_cast<long long>(step) + 1, ms, planned, static_cast<long long>(k.replan_at) + 1);
    std::fflush(stdout);
  }
}

// The lists of a drain (boundary .. replan_at) and of its re-profiling step, from the plan.
void Executor::kfac_drain_lists() {
  KfacState& k = *kfac_;
  const KfacPlan& p = *k.plan;
  // The cycle's units wrapped into the next cycle's leading gap (the front of cycle step 0) still
  // run, first thing at the boundary; then only F/B, communication, PREC and OPT.
  // (Chimera's group wraps inversions up to cycle step K: those of steps 1..K do not run; their
  // inverses would be pending until a sync that does not come, and re-profiling drops them.)
  const std::vector<Action> wrapped = p.wrapped(groups_.replica, device_, 0);
  k.drain_plain.clear();
  for (const Action& a : p.actions(groups_.replica, device_, 0))
    if (!is_kfac(a.kind) || a.kind == Kind::PREC) k.drain_plain.push_back(a);
  k.drain_first = wrapped;
  k.drain_first.insert(k.drain_first.end(), k.drain_plain.begin(), k.drain_plain.end());
  k.reprofile_first = k.boundary == k.replan_at ? wrapped : std::vector<Action>{};
  k.reprofile_first.insert(k.reprofile_first.end(), k.inline_list.begin(), k.inline_list.end());
  k.profile_start = k.replan_at;
}

// Broadcast of an inverse among a stage's holders (the planner's t_comm, ms and ms per byte):
// the comm performance model (comm/perf_model.hpp: measured once over this rank's first stage's
// holders, cached per machine), or --test-bcast-model (tests only: fixed numbers, so a test
// knows which pieces are broadcast).
std::pair<double, double> Executor::kfac_bcast_model() {
  KfacState& k = *kfac_;
  if (kfac_seams_.bcast_model) return *kfac_seams_.bcast_model;
  if (!k.bcast_model) {
    const comm::PerfModel& m = kfac_perf_model();
    k.bcast_model = {m.broadcast.alpha * 1e3, m.broadcast.beta * 1e3 / sizeof(float)};  // s per float -> ms per byte
  }
  return *k.bcast_model;
}

// The comm performance model, measured once over this rank's first stage's holders (the same
// communicator for both devices of a Chimera pair), or read from the per-machine cache. Collective
// over those holders.
const comm::PerfModel& Executor::kfac_perf_model() {
  KfacState& k = *kfac_;
  if (!k.perf) {
    size_t first = 0;
    for (size_t i = 1; i < chunks_.size(); ++i)
      if (chunks_[i]->stage < chunks_[first]->stage) first = i;
    k.perf = comm::load_or_measure_perf_model(k.holders[first].get(), time_one_inversion,
                                              comm::threads_per_rank(cfg_.train.threads));
  }
  return *k.perf;
}

// inline / skip with several copies per stage: one DistributedKfac per chunk over its holders.
// Its pipelining marks a factor complete at the chunk's last micro-batch, which must then be the
// last of both the forwards (A) and the backwards (B); a schedule file that orders them otherwise
// gets the all-reduce after the backward instead.
void Executor::kfac_setup_distributed() {
  KfacState& k = *kfac_;
  const comm::PerfModel& model = kfac_perf_model();
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = *chunks_[i];
    int last_forward = -1;
    for (const Action& a : actions_)
      if (a.kind == Kind::F && a.pipeline == c.pipeline && a.stage == c.stage) last_forward = a.micro_batch;
    DkfacOptions opt = dkfac_options(cfg_.kfac);
    opt.pipelining = opt.pipelining && last_forward == c.last_backward_mb;
    k.dist.push_back(std::make_unique<DistributedKfac>(k.chunk[i]->pre(), k.holders[i].get(), k.inverse_comms[i].get(),
                                                       model, opt));
    if (c.grad_sync) k.dist.back()->set_progress_hook([g = c.grad_sync.get()] { g->progress(); });
    k.chunk[i]->set_distributed(k.dist.back().get());
  }
}

// Before the gradient norm: every chunk preconditioned (a PREC the plan put after the first OPT
// runs now), then the split preconditions' all-gathers completed (all started first: see
// pipefisher.hpp), then the KL-clip.
void Executor::kfac_finish_precondition(double lr) {
  for (size_t i = 0; i < chunks_.size(); ++i) kfac_precondition(*chunks_[i], i);
  for (auto& ck : kfac_->chunk) ck->finish_gather();
  if (cfg_.kfac.kl_clip > 0) kfac_kl_clip(lr);
}

// The plan's precondition splits (PrecSplit): each chunk's owner of each layer as a rank of its
// all-gather communicator (members are (device, replica); -1: every holder).
void Executor::kfac_split_preconditions() {
  KfacState& k = *kfac_;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const PrecSplit* ps = k.plan->prec_split(chunks_[i]->pipeline, chunks_[i]->stage);
    if (!ps || !ps->split()) {
      k.chunk[i]->set_prec_split({}, MPI_COMM_NULL);
      continue;
    }
    MPI_Comm comm = k.prec_comms[i].get();
    MPI_Group world, holders;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Comm_group(comm, &holders);
    std::vector<int> owner;
    for (int o : ps->placement.owner) {
      int rank = -1;
      if (o != kEveryRank) {
        const int w = groups_.world_rank(ps->members.at(o).first, ps->members.at(o).second);
        MPI_Group_translate_ranks(world, 1, &w, holders, &rank);
        PF_CHECK(rank != MPI_UNDEFINED, "precondition split: rank {} holds no copy of stage {}", w, ps->stage);
      }
      owner.push_back(rank);
    }
    MPI_Group_free(&world);
    MPI_Group_free(&holders);
    k.chunk[i]->set_prec_split(std::move(owner), comm);
  }
}

// KL-clip over the whole model (the Trainer's kl_clip): v.g summed over every stage once
// (pipeline 0's chunks; replicas hold the same), then every chunk's gradients scaled.
void Executor::kfac_kl_clip(double lr) {
  double vg = 0;
  for (size_t i = 0; i < chunks_.size(); ++i)
    if (chunks_[i]->pipeline == 0) vg += kfac_->chunk[i]->pre().vg_sum();
  comm::allreduce_sum({&vg, 1}, groups_.pipeline.get(), "the KL-clip sum");
  const double nu = kl_clip_scale(vg, lr, cfg_.kfac.kl_clip);
  if (nu < 1.0)
    for (auto& ck : kfac_->chunk) ck->pre().scale_gradients(nu);
}

// Every rank contributes its measured means to one all-reduce, so every rank plans from the
// same numbers (the same bits) and gets the same plan.
void Executor::kfac_plan() {
  KfacState& k = *kfac_;
  const int W = layout_.replicas;
  const ProfileLayout shape(layout_);
  PlanProfile prof = shape.empty();
  k.profiled_compute = 0;
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Kind kd = actions_[i].kind;
    if (kd == Kind::F || kd == Kind::B || kd == Kind::I || kd == Kind::W || kd == Kind::OPT)
      prof.action_ms[device_][i] = k.dur_sum[i] / std::max(1, k.dur_samples) / W;
    if (kd != Kind::OPT && kd != Kind::ALLREDUCE && is_compute(kd)) k.profiled_compute += k.dur_sum[i] / std::max(1, k.dur_samples);
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const ChunkKfac& ck = *k.chunk[c];
    const ChunkKfacTimes& t = k.times[c];
    StageProfile& e = prof.stages[chunks_[c]->stage];
    e.holders += 1;
    e.layers += ck.layers();
    e.precondition += t.prec / std::max(1, t.prec_samples);
    e.sync += t.sync / std::max(1, t.curv_samples);
    for (int l = 0; l < ck.layers(); ++l) {
      LayerProfile& x = e.layer[l];
      const KfacLayer& layer = k.chunk[c]->pre().layer(l);
      x.curv_a += t.curv_a[l] / std::max(1, t.curv_samples);
      x.curv_b += t.curv_b[l] / std::max(1, t.curv_samples);
      x.inv_a += t.inv_a[l] / std::max(1, t.inv_samples);
      x.inv_b += t.inv_b[l] / std::max(1, t.inv_samples);
      x.d_in += static_cast<double>(layer.d_in());
      x.d_out += static_cast<double>(layer.d_out());
      x.diagonal_b += layer.b().diagonal() ? 1.0 : 0.0;
    }
  }
  // Every rank's model of its stage's broadcasts; the planner gets the mean.
  if (k.recorded.empty() && (W > 1 || layout_.pipelines() > 1)) std::tie(prof.bcast_alpha, prof.bcast_beta) = kfac_bcast_model();
  std::vector<double> v = shape.flatten(prof);
  if (!k.recorded.empty()) {
    v = k.recorded;  // kfac.plan_profile: every rank plans from the same recorded numbers
  } else {
    comm::allreduce_sum(v, MPI_COMM_WORLD, "the K-FAC profile");
  }
  // Tests only: --test-kfac-cost-scale scales the measured K-FAC unit costs the planner sees (a
  // schedule with tiny bubbles, Chimera on 2 devices, then refreshes within a short test run).
  k.plan_scale = kfac_seams_.cost_scale;
  k.plan_input = std::move(v);
  kfac_make_plan(false);
  if (groups_.rank == 0)  // out_dir exists: rank 0 made it before the first step
    write_file_atomic(cfg_.train.out_dir + "/kfac_profile.json", plan_profile_json().dump(1) + "\n");
}

nlohmann::json Executor::plan_profile_json() const {
  if (!kfac_ || !kfac_->plan) return nullptr;
  return {{"format", "pipefisher-plan-profile"},
          {"version", 1},
          {"pipefisher_plan", plan_record(cfg_, layout_, kfac_->plan_input)}};
}

nlohmann::json Executor::kfac_stage_costs() const {
  if (!kfac_ || !kfac_->plan) return nullptr;
  const PlanProfile prof = ProfileLayout(layout_).unflatten(kfac_->plan_input);
  nlohmann::json stages = nlohmann::json::array();
  for (const StageProfile& sum : prof.stages) {
    const StageProfile e = sum.mean();  // the stage's holders each added theirs
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < sum.layer_count(); ++l) {
      const LayerProfile& x = e.layer[l];
      layers.push_back({{"d_in", std::lround(x.d_in)}, {"d_out", std::lround(x.d_out)},
                        {"curvature_a", x.curv_a}, {"curvature_b", x.curv_b},
                        {"inversion_a", x.inv_a}, {"inversion_b", x.inv_b},
                        {"diagonal_b", x.diagonal_b > 0.5}});
    }
    stages.push_back({{"precondition", e.precondition}, {"sync", e.sync}, {"kfac_layers", layers}});
  }
  return stages;
}

void Executor::expand_inline_units(std::vector<Action>& actions, std::vector<ActionTime>& times) const {
  if (!kfac_) return;
  std::vector<Action> a2;
  std::vector<ActionTime> t2;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    size_t c = chunks_.size();
    if (a.kind == Kind::PREC)
      for (size_t k = 0; k < chunks_.size(); ++k)
        if (chunks_[k]->stage == a.stage && chunks_[k]->pipeline == a.pipeline) c = k;
    ActionTime t = times[i];
    if (c < chunks_.size()) {
      for (const ChunkKfac::UnitStamp& u : kfac_->chunk[c]->inline_units()) {
        if (u.start < t.start || u.end > t.end) continue;  // an earlier step's refresh
        a2.push_back({u.kind, a.stage, a.pipeline, -1, u.layer});
        t2.push_back({u.start, u.end, 0});
        t.start = u.end;  // the PREC's own work follows its units
        t.wait = 0;       // a wait before the units shows as the idle time before the first
      }
    }
    a2.push_back(a);
    t2.push_back(t);
  }
  actions = std::move(a2);
  times = std::move(t2);
}

std::vector<std::tuple<int, int, int, std::string>> Executor::kfac_layer_names() const {
  std::vector<std::tuple<int, int, int, std::string>> out;
  if (!kfac_) return out;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int l = 0; l < kfac_->chunk[c]->layers(); ++l) {
      // The layer's name: its weight's without ".weight" (bert.encoder.layer.0.attention.self.query).
      std::string name = kfac_->chunk[c]->pre().layer(l).name();
      if (name.ends_with(".weight")) name.resize(name.size() - 7);
      out.emplace_back(chunks_[c]->pipeline, chunks_[c]->stage, l, std::move(name));
    }
  return out;
}

// The plan from k.plan_input (the same bits on every rank): made at the end of a profile, or
// remade from a checkpoint (`restoring`: the factors' block structure and the record come from
// the checkpoint, so nothing is recorded or printed here).
namespace {

// One stage's K-FAC units for the planner: the mean of its profiled sums, times `scale`.
StageKfacCost stage_kfac_cost(const StageProfile& sum, double scale) {
  const StageProfile e = sum.mean();
  StageKfacCost c;
  c.precondition = e.precondition * scale;
  // Never zero: a zero-length SYNC_CURV would tie in start time with the inversions after it,
  // and the planner's list order breaks ties by start only.
  c.sync = std::max(e.sync, 1e-3) * scale;
  for (int l = 0; l < sum.layer_count(); ++l) {
    const LayerProfile& x = e.layer[l];
    c.curv_a.push_back(x.curv_a * scale);
    c.curv_b.push_back(x.curv_b * scale);
    c.inv_a.push_back(x.inv_a * scale);
    c.inv_b.push_back(x.inv_b * scale);
    c.dim_a.push_back(static_cast<int>(x.d_in + 0.5));
    c.dim_b.push_back(static_cast<int>(x.d_out + 0.5));
    c.diag_b.push_back(x.diagonal_b > 0.5 ? 1 : 0);
  }
  return c;
}

void print_plan(const KfacPlan& p, const PlanInput& in, const std::string& from) {
  std::string r;
  for (int x : p.refresh_steps) r += fmt::format("{}{}", r.empty() ? "" : " ", x);
  std::printf("pipefisher: planned from %s: refresh every %s steps (per device), %zu split "
              "inversions, inline work %.3f ms per cycle, utilization %.0f%%, step %.2f ms (%.2f ms without K-FAC "
              "units in bubbles)\n",
              from.c_str(), r.c_str(), p.splits.size(), p.inline_time, 100 * p.utilization, p.step_time,
              p.base_step_time);
  std::printf("pipefisher: %s (ms)\n", p.precondition_line().c_str());
  if (!p.placements.empty()) {  // several holders: SPD-KFAC's Algorithm 1 over each stage's holders
    int ct = 0, pieces = 0;
    for (const StagePlacement& sp : p.placements)  // Chimera's twins hold the same placement: count it once
      if (sp.pipeline == 0) ct += sp.placement.communicated(), pieces += static_cast<int>(sp.pieces.size());
    std::printf("pipefisher: inversion pieces: %d broadcast, %d inverted on every holder (broadcast model %.4g ms + "
                "%.4g ms/byte)\n", ct, pieces - ct, in.bcast_alpha, in.bcast_beta);
  }
  std::fflush(stdout);
}

}  // namespace

void Executor::kfac_make_plan(bool restoring) {
  KfacState& k = *kfac_;
  const int D = layout_.devices, W = layout_.replicas;
  const PlanProfile prof = ProfileLayout(layout_).unflatten(k.plan_input);
  // The whole lowered step with its measured durations: the planner sets the optimizer steps
  // aside and ends every list with them.
  PlanInput in;
  in.schedule = layout_.schedule;
  in.durations = prof.action_ms;
  in.replicas = W;
  in.margin = kPlanMargin;
  in.split_to_shorten = cfg_.kfac.split_inversions;
  // Chimera: a stage's twins and their replicas form one group sharing its inversions, each pair
  // of twins with its own cycle (PlanInput::chimera_group, the default).
  in.recompute = recompute_;
  in.bcast_alpha = prof.bcast_alpha / (D * W);
  in.bcast_beta = prof.bcast_beta / (D * W);
  for (const StageProfile& sum : prof.stages) in.kfac.push_back(stage_kfac_cost(sum, k.plan_scale));
  k.plan = std::make_unique<KfacPlan>(plan_kfac(in));
  kfac_split_preconditions();
  if (restoring) return;  // set_replicated and the blocks: ChunkKfac::load_state
  // Several holders per stage (replicas, Chimera's twins): from now on factors are committed at
  // SYNC_CURV and inverses travel with it.
  if (W > 1 || layout_.pipelines() > 1)
    for (size_t i = 0; i < chunks_.size(); ++i) k.chunk[i]->set_replicated(k.holders[i].get());
  kfac_split_as_planned();
  if (groups_.rank == 0)
    print_plan(*k.plan, in,
               k.recorded.empty()
                   ? fmt::format("{} profiled steps (steps {}-{})", kProfileSteps, k.profile_start + 1, k.plan_start)
                   : fmt::format("kfac.plan_profile = {}", cfg_.kfac.plan_profile));
}

// Block-diagonal factors as planned (a re-plan may also merge a factor back into one block).
void Executor::kfac_split_as_planned() {
  KfacState& k = *kfac_;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int l = 0; l < k.chunk[c]->layers(); ++l)
      for (Side sd : {Side::A, Side::B}) {
        int blocks = 1;
        for (const FactorSplit& f : k.plan->splits)
          if (chunks_[c]->pipeline == f.pipeline && chunks_[c]->stage == f.stage && f.layer == l &&
              (f.kind == Kind::INV_A) == (sd == Side::A))
            blocks = f.blocks;
        if (k.chunk[c]->pre().layer(l).factor(sd).num_blocks() != blocks) k.chunk[c]->split(l, sd, blocks, k.plan_start);
      }
}

}  // namespace pf
