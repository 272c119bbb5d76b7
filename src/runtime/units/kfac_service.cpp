// One K-FAC service per stage group (kfac_service.hpp): the group's communicators and
// DistributedKfac, the factor sums, the plan's sharing, broadcasts and split, and what each step's
// PREC does.
#include "runtime/units/kfac_service.hpp"

#include "core/error.hpp"
#include "core/micro_batch.hpp"
#include "dkfac/factor_sum.hpp"
#include "runtime/hosted_chunk.hpp"

#include <utility>

namespace pf {

KfacService::KfacService(const HostedChunk& chunk, const Config& cfg, int replica, int micro_batches, int64_t rows,
                         Refresh refresh, bool overlap)
    : replica_(replica),
      micro_batches_(micro_batches),
      chunk_(std::make_unique<ChunkKfac>(*chunk.model, cfg, replica, micro_batches, chunk.slot, rows,
                                         refresh == Refresh::units, overlap, sync_)),
      refresh_(refresh) {}

KfacService::~KfacService() = default;

// The factor sums get a communicator of their own (another stream of collectives than the
// gradient buckets); a second one carries the DistributedKfac's inverse broadcasts (whole) or the
// precondition's all-gathers (units).
void KfacService::connect(MPI_Comm base) {
  auto dup = [base] {
    MPI_Comm d = MPI_COMM_NULL;
    comm::check(MPI_Comm_dup(base, &d), "MPI_Comm_dup(kfac holders)");
    return comm::Comm(d);
  };
  holders_ = dup();
  (refresh_ == Refresh::units ? prec_comm_ : inverse_comm_) = dup();
}

// The DistributedKfac's pipelining marks a factor complete at the chunk's last micro-batch, which
// must then be the last of both the forwards (A) and the backwards (B); a schedule file that
// orders them otherwise gets the all-reduce after the backward instead.
void KfacService::share(const HostedChunk& chunk, const comm::PerfModel& model, const DkfacOptions& opt) {
  PF_CHECK(refresh_ == Refresh::whole, "a DistributedKfac for the plan's units");
  DkfacOptions o = opt;
  o.pipelining = o.pipelining && chunk.last_forward_mb == chunk.last_backward_mb;
  last_backward_mb_ = chunk.last_backward_mb;
  dist_ = std::make_unique<DistributedKfac>(chunk_->pre(), holders_.get(), inverse_comm_.get(), model, o);
  if (comm::BucketedAllReduce* g = chunk.grad_sync.get()) dist_->set_progress_hook([g] { g->progress(); });
  chunk_->set_distributed(dist_.get());
}

void KfacService::begin_whole_step(int64_t step, bool curvature, bool inversion, const std::vector<MicroBatch>& mbs) {
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  chunk_->begin_step(step, false, curvature, scale);
  // The DistributedKfac marks a factor complete at its chunk's last micro-batch of the step.
  if (curvature && dist_)
    dist_->begin_step(mbs.at(static_cast<size_t>(replica_) * micro_batches_ + last_backward_mb_).index);
  prec_ = {PrecWork::Kind::refresh, curvature, inversion, nullptr};
}

void KfacService::begin_units_step(int64_t step, bool save, float loss_scale, ChunkKfacTimes* profile) {
  chunk_->begin_step(step, save, false, loss_scale);
  prec_ = profile ? PrecWork{PrecWork::Kind::profile, true, true, profile} : PrecWork{};
}

std::vector<float> KfacService::sum_factors(bool factors) {
  return sum_factors_over_copies(chunk_->pre(), holders_.get(), factors);
}

// A poisoned cycle adds no factors (every holder alike); the row counts still meet.
void KfacService::sync(int64_t) {
  PF_CHECK(sync_.on(), "SYNC_CURV outside replicated bubbles");
  chunk_->commit_synced(sum_factors(!chunk_->poisoned()));
}

void KfacService::broadcast(Side s, int layer, int block, int owner) { chunk_->broadcast(s, layer, block, owner); }

// The plan's precondition split: each layer's owner as a rank of the group's all-gather
// communicator (the plan names members as (device, replica); -1: every holder).
void KfacService::split_precondition(const PrecSplit* split, const comm::Groups& groups) {
  if (!split || !split->split()) {
    gather_.set({}, MPI_COMM_NULL, chunk_->pre());
    return;
  }
  MPI_Comm comm = prec_comm_.get();
  MPI_Group world, holders;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Comm_group(comm, &holders);
  std::vector<int> owner;
  for (int o : split->placement.owner) {
    int rank = -1;
    if (o != kEveryRank) {
      const int w = groups.world_rank(split->members.at(o).first, split->members.at(o).second);
      MPI_Group_translate_ranks(world, 1, &w, holders, &rank);
      PF_CHECK(rank != MPI_UNDEFINED, "precondition split: rank {} holds no copy of stage {}", w, split->stage);
    }
    owner.push_back(rank);
  }
  MPI_Group_free(&world);
  MPI_Group_free(&holders);
  gather_.set(std::move(owner), comm, chunk_->pre());
}

KfacWork KfacService::precondition(int64_t step) {
  ChunkKfac& ck = *chunk_;
  if (ck.preconditioned()) return {};
  raw_grad_sq_ = ck.pre().grad_sq_sum();
  // An inline refresh's work counts one unit per K-FAC layer of the chunk (StepOutcome).
  const int layers = ck.layers();
  ChunkKfac::FactorSum sum;
  if (holders_.get() != MPI_COMM_NULL) sum = [this] { return sum_factors(true); };
  switch (prec_.kind) {
    case PrecWork::Kind::refresh:
      ck.inline_refresh(step, prec_.curvature, prec_.inversion, sum, nullptr);
      return {prec_.curvature ? layers : 0, prec_.inversion ? layers : 0};
    case PrecWork::Kind::profile:
      ck.set_replicated(MPI_COMM_NULL);               // re-profiling: inline, as at the start (pending inverses dropped)
      gather_.set({}, MPI_COMM_NULL, ck.pre());       // every layer: the plan needs the whole stage's time
      ck.inline_refresh(step, true, true, sum, prec_.times);
      return {layers, layers};
    case PrecWork::Kind::apply:
      if (!gather_.split()) {
        ck.precondition(step);
      } else {
        ck.precondition(step, [this](int l) { return gather_.mine(l); });
        gather_.start(ck.pre());
      }
      return {};
  }
  return {};
}

}  // namespace pf
