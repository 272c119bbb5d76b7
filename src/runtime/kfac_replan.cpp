// Planning and re-planning in the executor (runtime/README.md): the all-reduced profile into the
// planner, the plan's splits and precondition splits applied, and drift (forward/backward far over
// the profile) deciding a drain and a re-plan.
#include "runtime/executor.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "kfac/factor.hpp"
#include "kfac/kfac_layer.hpp"
#include "runtime/executor_parts.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace pf {

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
  k.replan_at = k.plan_start + p.all_cycles_start(next);
  k.boundary = k.plan_start + p.next_cycle_start(device_, next);
  kfac_drain_lists();
  if (groups_.rank == 0) {
    std::printf("pipefisher: step %lld: forward/backward %.1f ms, over 30%% above the profiled %.1f ms for 3 steps "
                "(on some rank): durations drifted; re-profiling from step %lld and re-planning\n",
                static_cast<long long>(step) + 1, ms, planned, static_cast<long long>(k.replan_at) + 1);
    std::fflush(stdout);
  }
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

namespace {

// One chunk's measured K-FAC units: the means of its timed samples, with its factors' sizes.
StageKfacCost measured_cost(ChunkKfac& ck, const ChunkKfacTimes& t) {
  StageKfacCost c;
  c.precondition = t.prec / std::max(1, t.prec_samples);
  c.sync = t.sync / std::max(1, t.curv_samples);
  for (int l = 0; l < ck.layers(); ++l) {
    const KfacLayer& layer = ck.pre().layer(l);
    c.curv_a.push_back(t.curv_a[l] / std::max(1, t.curv_samples));
    c.curv_b.push_back(t.curv_b[l] / std::max(1, t.curv_samples));
    c.inv_a.push_back(t.inv_a[l] / std::max(1, t.inv_samples));
    c.inv_b.push_back(t.inv_b[l] / std::max(1, t.inv_samples));
    c.dim_a.push_back(static_cast<int>(layer.d_in()));
    c.dim_b.push_back(static_cast<int>(layer.d_out()));
    c.diag_b.push_back(layer.b().diagonal() ? 1 : 0);
  }
  return c;
}

}  // namespace

// Every rank contributes its measured means to one all-reduce (runtime/plan_record.hpp's wire
// form), so every rank plans from the same numbers (the same bits) and gets the same plan.
void Executor::kfac_plan() {
  KfacState& k = *kfac_;
  const int W = layout_.replicas;
  std::vector<double> mine(actions_.size(), 0.0);  // this device's action times, over the replicas
  k.profiled_compute = 0;
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Kind kd = actions_[i].kind;
    if (planner_measures(kd)) mine[i] = k.dur_sum[i] / std::max(1, k.dur_samples) / W;
    if (kd != Kind::OPT && kd != Kind::ALLREDUCE && is_compute(kd)) k.profiled_compute += k.dur_sum[i] / std::max(1, k.dur_samples);
  }
  if (k.recorded) {
    k.plan_input = *k.recorded;  // kfac.plan_profile: every rank plans from the same recorded numbers
  } else {
    const ProfileLayout wire(layout_);
    std::vector<double> v = wire.zeros();
    wire.set_actions(v, device_, mine);
    for (size_t c = 0; c < chunks_.size(); ++c) wire.add_stage(v, chunks_[c]->stage, measured_cost(*k.chunk[c], k.times[c]));
    if (wire.broadcast) {  // every rank's model of its stage's broadcasts; the planner gets the mean
      const auto [alpha, beta] = kfac_bcast_model();
      wire.add_broadcast(v, alpha, beta);
    }
    comm::allreduce_sum(v, MPI_COMM_WORLD, "the K-FAC profile");
    k.plan_input = wire.mean(v);
    k.plan_input.shape = plan_shape(cfg_, layout_);
  }
  // Tests only: --test-kfac-cost-scale scales the measured K-FAC unit costs the planner sees (a
  // schedule with tiny bubbles, Chimera on 2 devices, then refreshes within a short test run).
  k.plan_scale = kfac_seams_.cost_scale;
  kfac_make_plan(false);
  if (groups_.rank == 0)  // out_dir exists: rank 0 made it before the first step
    write_file_atomic(cfg_.train.out_dir + "/kfac_profile.json", plan_profile_json(cfg_, layout_, k.plan_input).dump(1) + "\n");
}

// The plan from k.plan_input (the same bits on every rank): made at the end of a profile, or
// remade from a checkpoint (`restoring`: the factors' block structure and the record come from
// the checkpoint, so nothing is recorded or printed here).

void Executor::kfac_make_plan(bool restoring) {
  KfacState& k = *kfac_;
  const int W = layout_.replicas;
  const PlanProfile& prof = k.plan_input;
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
  in.bcast_alpha = std::max(0.0, prof.bcast_alpha);  // none: no broadcasts to model
  in.bcast_beta = std::max(0.0, prof.bcast_beta);
  for (const StageKfacCost& c : prof.kfac) in.kfac.push_back(planner_cost(c, k.plan_scale));
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
               !k.recorded
                   ? fmt::format("{} profiled steps (steps {}-{})", kProfileSteps, k.profile_start + 1, k.plan_start)
                   : fmt::format("kfac.plan_profile = {}", cfg_.kfac.plan_profile));
}

// Block-diagonal factors as planned (a re-plan may also merge a factor back into one block).
void Executor::kfac_split_as_planned() {
  KfacState& k = *kfac_;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int l = 0; l < k.chunk[c]->layers(); ++l)
      for (Side sd : {Side::A, Side::B}) {
        const int blocks = k.plan->split_blocks(chunks_[c]->pipeline, chunks_[c]->stage, l, sd == Side::A ? Kind::INV_A : Kind::INV_B);
        if (k.chunk[c]->pre().layer(l).factor(sd).num_blocks() != blocks) k.chunk[c]->split(l, sd, blocks, k.plan_start);
      }
}

}  // namespace pf
