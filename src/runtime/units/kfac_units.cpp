// K-FAC's units on one rank (kfac_units.hpp): the records' set-up, the handlers of the K-FAC
// action kinds sent to the chunks' services, the KL-clip before the gradient norm.
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
                     KfacService::Refresh refresh)
    : cfg_(cfg), layout_(layout), groups_(groups), chunks_(chunks) {
  const int64_t rows = static_cast<int64_t>(cfg.parallel.micro_batch_size) * cfg.model.seq_len;
  for (HostedChunk& c : chunks)
    c.kfac = {new KfacService(c, cfg, groups.replica, layout.micro_batches, rows, refresh, layout.pipelines() > 1),
              [](KfacService* k) { delete k; }};
  if (!layout.grad_sync) return;
  connect_in_stage_order();
  if (refresh == KfacService::Refresh::whole) share_whole_refreshes();
}

KfacUnits::~KfacUnits() = default;

// Communicators are made in stage order on every member of a group (MPI_Comm_dup is collective).
void KfacUnits::connect_in_stage_order() {
  std::vector<HostedChunk*> order;
  for (HostedChunk& c : chunks_) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const HostedChunk* a, const HostedChunk* b) { return a->stage < b->stage; });
  for (HostedChunk* c : order)
    c->kfac->connect(layout_.pipelines() > 1 ? groups_.holders_comm(c->stage) : groups_.data_parallel.get());
}

// inline / skip with several copies per stage: each group's DistributedKfac.
void KfacUnits::share_whole_refreshes() {
  const comm::PerfModel& model = perf_model();
  for (HostedChunk& c : chunks_) c.kfac->share(c, model, dkfac_options(cfg_.kfac));
}

const comm::PerfModel& KfacUnits::perf_model() {
  if (!perf_) {
    const HostedChunk* first = &chunks_[0];
    for (const HostedChunk& c : chunks_) first = c.stage < first->stage ? &c : first;
    perf_ = comm::load_or_measure_perf_model(first->kfac->holders(), time_one_inversion,
                                             comm::threads_per_rank(cfg_.train.threads));
  }
  return *perf_;
}

void KfacUnits::begin_step(int64_t step) {
  step_ = step;
  work_ = {};
}

void KfacUnits::curvature(const Action& a) {
  service(a.pipeline, a.stage).curvature(side_at(side_index(a.kind)), a.layer, a.micro_batch);
  ++work_.curvature;
}

void KfacUnits::inversion(const Action& a) {
  service(a.pipeline, a.stage).invert(side_at(side_index(a.kind)), a.layer, a.block);
  ++work_.inversion;
}

void KfacUnits::curvature_sync(const Action& a) { service(a.pipeline, a.stage).sync(step_); }

// The holder that inverted the piece (a replica, or Chimera's twin of some replica) sends it.
void KfacUnits::inverse_broadcast(const Action& a) {
  PF_CHECK(inverter_, "{}: a broadcast without a plan", to_token(a));
  service(a.pipeline, a.stage).broadcast(side_at(side_index(a.kind)), a.layer, a.block, inverter_(a));
}

void KfacUnits::precondition(const Action& a) { precondition(service(a.pipeline, a.stage)); }

void KfacUnits::precondition(KfacService& k) {
  const KfacWork w = k.precondition(step_);
  work_.curvature += w.curvature;
  work_.inversion += w.inversion;
}

void KfacUnits::skip_inputs(int pipeline, int stage, bool on) { service(pipeline, stage).chunk().skip_inputs(on); }

// Every chunk preconditioned (a PREC the plan put after the first OPT runs now), then the split
// preconditions' all-gathers completed (all started first: see chunk_kfac.hpp), then the KL-clip.
void KfacUnits::before_gradient_norm(double lr) {
  for (HostedChunk& c : chunks_) precondition(*c.kfac);
  for (HostedChunk& c : chunks_) c.kfac->finish_gather();
  if (cfg_.kfac.kl_clip > 0) kl_clip(lr);
}

// KL-clip over the whole model (the Trainer's kl_clip): v.g summed over every stage once
// (pipeline 0's chunks; replicas hold the same), then every chunk's gradients scaled.
void KfacUnits::kl_clip(double lr) {
  double vg = 0;
  for (HostedChunk& c : chunks_)
    if (c.pipeline == 0) vg += c.kfac->chunk().pre().vg_sum();
  comm::allreduce_sum({&vg, 1}, groups_.pipeline.get(), "the KL-clip sum");
  const double nu = kl_clip_scale(vg, lr, cfg_.kfac.kl_clip);
  if (nu < 1.0)
    for (HostedChunk& c : chunks_) c.kfac->chunk().pre().scale_gradients(nu);
}

double KfacUnits::raw_grad_sq(int pipeline, int stage, double sq) const {
  KfacService& k = service(pipeline, stage);  // ChunkKfac::pre is not const
  return sq - k.chunk().pre().grad_sq_sum() + k.raw_grad_sq();
}

int64_t KfacUnits::tap_ns() const {
  int64_t ns = 0;
  for (const HostedChunk& c : chunks_) ns += c.kfac->chunk().tap_ns();
  return ns;
}

void KfacUnits::discard_step() {
  for (HostedChunk& c : chunks_) c.kfac->chunk().discard_step();
}

}  // namespace pf
