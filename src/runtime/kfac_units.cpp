// K-FAC's set-up and units in the executor (runtime/README.md): a ChunkKfac per hosted chunk
// (chunk_kfac.hpp), its communicators and, for inline / skip with copies, its DistributedKfac;
// the handlers of the K-FAC action kinds (the executor's dispatch table), the precondition and
// the KL-clip before the gradient norm.
#include "runtime/executor.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "kfac/factor.hpp"
#include "kfac/kfac_layer.hpp"
#include "runtime/executor_parts.hpp"
#include "runtime/plan_record.hpp"

#include <algorithm>

namespace pf {

Executor::~Executor() = default;

void Executor::kfac_setup() {
  kfac_ = std::make_unique<KfacState>();
  KfacState& k = *kfac_;
  k.bubbles = cfg_.kfac.placement == Placement::Bubbles;
  if (k.bubbles && !cfg_.kfac.plan_profile.empty())
    k.recorded = read_plan_profile(cfg_, layout_);
  const int N = layout_.micro_batches;
  for (auto& c : chunks_) {
    k.chunk.push_back(std::make_unique<ChunkKfac>(*c->model, cfg_, groups_.replica, N, c->slot,
                                                  static_cast<int64_t>(cfg_.parallel.micro_batch_size) * cfg_.model.seq_len,
                                                  layout_.pipelines() > 1));
    c->kfac = k.chunk.back().get();
    k.times.emplace_back();
    k.raw_grad_sq.push_back(0);
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
  InlineStep inline_step = profiling_actions(layout_.schedule, device_);
  k.inline_list = std::move(inline_step.actions);
  k.lowered_index = std::move(inline_step.step_index);
  k.dur_sum.assign(actions_.size(), 0.0);
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

size_t Executor::kfac_chunk_index(const Action& a) const {
  size_t i = 0;
  while (i < chunks_.size() && !(chunks_[i]->pipeline == a.pipeline && chunks_[i]->stage == a.stage)) ++i;
  PF_CHECK(i < chunks_.size(), "device {} does not host stage {} of pipeline {}", device_, a.stage, a.pipeline);
  return i;
}

void Executor::on_curvature(const Action& a, const StepInputs&) {
  kfac_->chunk[kfac_chunk_index(a)]->curvature(a.kind == Kind::CURV_A ? Side::A : Side::B, a.layer, a.micro_batch);
  ++kfac_curv_;
}

void Executor::on_inversion(const Action& a, const StepInputs&) {
  kfac_->chunk[kfac_chunk_index(a)]->invert(a.kind == Kind::INV_A ? Side::A : Side::B, a.layer, a.block);
  ++kfac_inv_;
}

void Executor::on_curvature_sync(const Action& a, const StepInputs&) { kfac_->chunk[kfac_chunk_index(a)]->sync(step_); }

void Executor::on_precondition(const Action& a, const StepInputs&) {
  const size_t i = kfac_chunk_index(a);
  kfac_precondition(*chunks_[i], i);
}

// The holder that inverted the piece (a replica, or Chimera's twin of some replica) sends it.
void Executor::on_inverse_broadcast(const Action& a, const StepInputs&) {
  const auto owner = kfac_->plan->inverter(a);
  PF_CHECK(owner.has_value(), "{}: a broadcast of a piece every holder inverts", to_token(a));
  kfac_->chunk[kfac_chunk_index(a)]->broadcast(a.kind == Kind::BCAST_INV_A ? Side::A : Side::B, a.layer, a.block,
                                                groups_.world_rank(owner->first, owner->second));
}

void Executor::kfac_precondition(Chunk& c, size_t index) {
  KfacState& k = *kfac_;
  ChunkKfac& ck = *k.chunk[index];
  if (ck.preconditioned()) return;
  if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;  // precondition the summed gradient
  k.raw_grad_sq[index] = ck.pre().grad_sq_sum();
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

// Before the gradient norm: every chunk preconditioned (a PREC the plan put after the first OPT
// runs now), then the split preconditions' all-gathers completed (all started first: see
// chunk_kfac.hpp), then the KL-clip.
void Executor::kfac_finish_precondition(double lr) {
  for (size_t i = 0; i < chunks_.size(); ++i) kfac_precondition(*chunks_[i], i);
  for (auto& ck : kfac_->chunk) ck->finish_gather();
  if (cfg_.kfac.kl_clip > 0) kfac_kl_clip(lr);
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

void Executor::kfac_discard_step() {
  for (auto& ck : kfac_->chunk) ck->discard_step();
}

}  // namespace pf
