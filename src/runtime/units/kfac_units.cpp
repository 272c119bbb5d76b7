// K-FAC's units on one rank (kfac_units.hpp): the records' set-up, the handlers of the K-FAC
// action kinds, the precondition and the KL-clip before the gradient norm.
#include "runtime/units/kfac_units.hpp"

#include "comm/collectives.hpp"
#include "comm/small.hpp"
#include "comm/wait.hpp"
#include "core/error.hpp"
#include "kfac/factor.hpp"
#include "kfac/kfac_layer.hpp"

#include <algorithm>
#include <utility>

namespace pf {

KfacUnits::KfacUnits(const Config& cfg, const Layout& layout, const comm::Groups& groups, HostedChunks& chunks,
                     bool planned)
    : cfg_(cfg), layout_(layout), groups_(groups), chunks_(chunks) {
  const int64_t rows = static_cast<int64_t>(cfg.parallel.micro_batch_size) * cfg.model.seq_len;
  for (HostedChunk& c : chunks) {
    c.kfac = {new HostedKfac, [](HostedKfac* k) { delete k; }};
    c.kfac->chunk = std::make_unique<ChunkKfac>(*c.model, cfg, groups.replica, layout.micro_batches, c.slot, rows,
                                                planned, layout.pipelines() > 1);
  }
  if (!layout.grad_sync) return;
  make_communicators(planned);
  if (!planned) make_distributed();
}

KfacUnits::~KfacUnits() = default;

// Factor sums among a stage's copies get their own communicators (another stream of collectives
// than the gradient buckets), made in stage order on every member; a second one carries the
// DistributedKfac's inverse broadcasts (inline / skip) or the precondition's all-gathers (bubbles).
void KfacUnits::make_communicators(bool planned) {
  std::vector<HostedChunk*> order;
  for (HostedChunk& c : chunks_) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const HostedChunk* a, const HostedChunk* b) { return a->stage < b->stage; });
  auto dup = [](MPI_Comm base) {
    MPI_Comm d = MPI_COMM_NULL;
    comm::check(MPI_Comm_dup(base, &d), "MPI_Comm_dup(kfac holders)");
    return comm::Comm(d);
  };
  for (HostedChunk* c : order) {
    MPI_Comm base = layout_.pipelines() > 1 ? groups_.holders_comm(c->stage) : groups_.data_parallel.get();
    c->kfac->holders = dup(base);
    (planned ? c->kfac->prec_comm : c->kfac->inverse_comm) = dup(base);
  }
}

// inline / skip with several copies per stage: one DistributedKfac per chunk over its holders.
// Its pipelining marks a factor complete at the chunk's last micro-batch, which must then be the
// last of both the forwards (A) and the backwards (B); a schedule file that orders them otherwise
// gets the all-reduce after the backward instead.
void KfacUnits::make_distributed() {
  const comm::PerfModel& model = perf_model();
  for (HostedChunk& c : chunks_) {
    HostedKfac& h = *c.kfac;
    DkfacOptions opt = dkfac_options(cfg_.kfac);
    opt.pipelining = opt.pipelining && c.last_forward_mb == c.last_backward_mb;
    h.dist = std::make_unique<DistributedKfac>(h.chunk->pre(), h.holders.get(), h.inverse_comm.get(), model, opt);
    if (comm::BucketedAllReduce* g = c.grad_sync.get()) h.dist->set_progress_hook([g] { g->progress(); });
    h.chunk->set_distributed(h.dist.get());
  }
}

const comm::PerfModel& KfacUnits::perf_model() {
  if (!perf_) {
    const HostedChunk* first = &chunks_[0];
    for (const HostedChunk& c : chunks_) first = c.stage < first->stage ? &c : first;
    perf_ = comm::load_or_measure_perf_model(first->kfac->holders.get(), time_one_inversion,
                                             comm::threads_per_rank(cfg_.train.threads));
  }
  return *perf_;
}

void KfacUnits::begin_step(int64_t step) {
  step_ = step;
  work_ = {};
}

void KfacUnits::curvature(const Action& a) {
  hosted(a.pipeline, a.stage).chunk->curvature(side_at(side_index(a.kind)), a.layer, a.micro_batch);
  ++work_.curvature;
}

void KfacUnits::inversion(const Action& a) {
  hosted(a.pipeline, a.stage).chunk->invert(side_at(side_index(a.kind)), a.layer, a.block);
  ++work_.inversion;
}

void KfacUnits::curvature_sync(const Action& a) { hosted(a.pipeline, a.stage).chunk->sync(step_); }

// The holder that inverted the piece (a replica, or Chimera's twin of some replica) sends it.
void KfacUnits::inverse_broadcast(const Action& a) {
  PF_CHECK(inverter_, "{}: a broadcast without a plan", to_token(a));
  hosted(a.pipeline, a.stage).chunk->broadcast(side_at(side_index(a.kind)), a.layer, a.block, inverter_(a));
}

void KfacUnits::precondition(const Action& a) { precondition(hosted(a.pipeline, a.stage)); }

void KfacUnits::precondition(HostedKfac& h) {
  ChunkKfac& ck = *h.chunk;
  if (ck.preconditioned()) return;
  h.raw_grad_sq = ck.pre().grad_sq_sum();
  // An inline refresh's work counts one unit per K-FAC layer of the chunk (StepOutcome).
  const int layers = static_cast<int>(ck.pre().size());
  const PrecWork& w = h.prec;
  switch (w.kind) {
    case PrecWork::Kind::refresh:
      ck.inline_refresh(step_, w.curvature, w.inversion, h.holders.get(), nullptr);
      work_.curvature += w.curvature ? layers : 0;
      work_.inversion += w.inversion ? layers : 0;
      break;
    case PrecWork::Kind::profile:
      ck.set_replicated(MPI_COMM_NULL);      // re-profiling: inline, as at the start (pending inverses dropped)
      ck.set_prec_split({}, MPI_COMM_NULL);  // every layer: the plan needs the whole stage's time
      ck.inline_refresh(step_, true, true, h.holders.get(), w.times);
      work_.curvature += layers;
      work_.inversion += layers;
      break;
    case PrecWork::Kind::apply:
      ck.precondition(step_);
      break;
  }
}

void KfacUnits::skip_inputs(int pipeline, int stage, bool on) { hosted(pipeline, stage).chunk->skip_inputs(on); }

// Every chunk preconditioned (a PREC the plan put after the first OPT runs now), then the split
// preconditions' all-gathers completed (all started first: see chunk_kfac.hpp), then the KL-clip.
void KfacUnits::before_gradient_norm(double lr) {
  for (HostedChunk& c : chunks_) precondition(*c.kfac);
  for (HostedChunk& c : chunks_) c.kfac->chunk->finish_gather();
  if (cfg_.kfac.kl_clip > 0) kl_clip(lr);
}

// KL-clip over the whole model (the Trainer's kl_clip): v.g summed over every stage once
// (pipeline 0's chunks; replicas hold the same), then every chunk's gradients scaled.
void KfacUnits::kl_clip(double lr) {
  double vg = 0;
  for (HostedChunk& c : chunks_)
    if (c.pipeline == 0) vg += c.kfac->chunk->pre().vg_sum();
  comm::allreduce_sum({&vg, 1}, groups_.pipeline.get(), "the KL-clip sum");
  const double nu = kl_clip_scale(vg, lr, cfg_.kfac.kl_clip);
  if (nu < 1.0)
    for (HostedChunk& c : chunks_) c.kfac->chunk->pre().scale_gradients(nu);
}

double KfacUnits::raw_grad_sq(int pipeline, int stage, double sq) const {
  const HostedKfac& h = hosted(pipeline, stage);
  return sq - h.chunk->pre().grad_sq_sum() + h.raw_grad_sq;
}

int64_t KfacUnits::tap_ns() const {
  int64_t ns = 0;
  for (const HostedChunk& c : chunks_) ns += c.kfac->chunk->tap_ns();
  return ns;
}

void KfacUnits::discard_step() {
  for (HostedChunk& c : chunks_) c.kfac->chunk->discard_step();
}

}  // namespace pf
