#include "runtime/units/chunk_kfac.hpp"

#include "comm/clock.hpp"
#include "core/error.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "dkfac/factor_sum.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pf {

namespace {
// Milliseconds from t0 (comm::steady_now_ns) to now.
double ms_since(int64_t t0) { return static_cast<double>(comm::steady_now_ns() - t0) / 1e6; }

std::vector<std::string> layer_names(const KfacPreconditioner& pre) {
  std::vector<std::string> names;
  for (size_t l = 0; l < pre.size(); ++l) names.push_back(pre.layer(l).name());
  return names;
}
}  // namespace

ChunkKfac::ChunkKfac(Model& model, const Config& cfg, int replica, int micro_batches, std::vector<int> slot_of,
                     int64_t rows, bool saves, bool overlap, ReplicaSync& sync)
    : cfg_(cfg),
      pre_(std::make_unique<KfacPreconditioner>(model.linears(), cfg.kfac, cfg.model.vocab)),
      overlap_(overlap),
      saved_(*pre_, replica, micro_batches, std::move(slot_of), rows, saves),
      record_(layer_names(*pre_)),
      sync_(sync) {
  curv_count_.assign(layers(), {0, 0});
}

ChunkKfac::~ChunkKfac() { attach(false); }

void ChunkKfac::attach(bool on) {
  for (size_t i = 0; i < pre_->size(); ++i) {
    Linear& l = pre_->linear(i);
    if (on) l.set_tap(this);
    else if (l.tap() == this) l.set_tap(nullptr);
  }
}

void ChunkKfac::begin_step(int64_t t, bool save, bool taps, float loss_scale) {
  preconditioned_ = false;
  saving_ = save;
  tapping_ = taps;
  // A new cycle's buffers take over at the first copy, not now: the previous cycle's wrapped
  // units (in this step's leading gap, before any forward) still read the old ones.
  if (save) next_cycle_ = {t, loss_scale};
  if (taps) loss_scale_ = loss_scale;
  attach(save || taps);
  snapshot_.clear();
  if (taps) take_snapshot(false);  // a non-finite step is undone (discard_step)
}

// A new cycle's buffers take over at its first copy (begin_step).
void ChunkKfac::take_over_cycle() {
  if (next_cycle_.first < 0) return;
  cycle_step_ = next_cycle_.first;
  loss_scale_ = next_cycle_.second;
  next_cycle_.first = -1;
  poisoned_ = false;
  take_snapshot(true);  // after the previous cycle's wrapped units: only this cycle's are undone
}

void ChunkKfac::on_input(const Linear& l, int micro_batch, const float* x, int64_t rows, int64_t cols) {
  const int i = pre_->index_of(l);
  if (i < 0 || skip_inputs_) return;
  const int64_t t0 = comm::steady_now_ns();
  if (saving_) take_over_cycle(), saved_.save(i, Side::A, micro_batch, x, rows, cols);
  if (tapping_ && dist_) dist_->on_input(l, micro_batch, x, rows, cols);
  else if (tapping_) pre_->curvature(i, Side::A, x, rows);
  tap_ns_ += comm::steady_now_ns() - t0;
}

void ChunkKfac::on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t cols) {
  const int i = pre_->index_of(l);
  if (i < 0) return;
  const int64_t t0 = comm::steady_now_ns();
  if (saving_) take_over_cycle(), saved_.save(i, Side::B, micro_batch, g, rows, cols);
  if (tapping_ && dist_) dist_->on_grad_output(l, micro_batch, g, rows, cols);
  else if (tapping_) pre_->curvature(i, Side::B, g, rows);
  tap_ns_ += comm::steady_now_ns() - t0;
}

void ChunkKfac::curvature(Side s, int layer, int m) {
  const int k = saved_.slot(m);
  if (poisoned_) return;  // the cycle's step was non-finite: no curvature from it (discard_step)
  pre_->curvature(layer, s, saved_.data(layer, s, k), saved_.rows(layer, s, k));
  // The cycle's last micro-batch of this factor: commit (scaled by the convention).
  if (++curv_count_[layer][side_index(s)] == saved_.slots()) {
    curv_count_[layer][side_index(s)] = 0;
    if (sync_.on()) return;  // committed at SYNC_CURV
    if (pre_->finish_curvature(layer, s, loss_scale_)) record_.committed(layer, s, cycle_step_);
  }
}

void ChunkKfac::invert(Side s, int layer, int block) {
  if (!record_.has_factor(layer, s)) return;  // nothing to invert yet
  KfacLayer& kl = pre_->layer(layer);
  if (sync_.on()) sync_.keep_in_use(kl.factor(s));  // the inverse in use stays until SYNC_CURV
  if (block < 0) pre_->invert(layer, s);
  else kl.invert_block(s, block, cfg_.kfac.damping);
  if (sync_.on()) {
    sync_.set_aside(kl.factor(s), layer, s, block);
    return;
  }
  // A whole inversion supersedes the factor's block inversions (a re-profile right after a
  // cycle's wrapped block inversions, in the same step): the record must not replay them after it.
  if (block < 0) record_.drop_blocks(layer, s);
  record_.inverted(layer, s, block);
}

void ChunkKfac::precondition(int64_t t, const std::function<bool(int)>& mine) {
  if (!mine) {
    pre_->precondition_all();
  } else {
    for (int l = 0; l < layers(); ++l)
      if (mine(l)) pre_->precondition(l);
  }
  preconditioned_ = true;
  record_.used_at(t);
}

ChunkKfac::LayerShape ChunkKfac::shape(int layer) const {
  const KfacLayer& l = pre_->layer(layer);
  return {l.d_in(), l.d_out(), l.b().diagonal()};
}

// One inline K-FAC unit, as the profiler and trace show it: from t0 to now.
void ChunkKfac::stamp(Kind k, int layer, int64_t t0) { inline_units_.push_back({k, layer, t0, comm::steady_now_ns()}); }

// Several holders, inline / skip: the DistributedKfac sums the factors and inverts.
void ChunkKfac::distributed_refresh(int64_t t, bool curvature, bool inversion) {
  attach(false);
  if (curvature) {
    const auto t0 = comm::steady_now_ns();
    for (const auto& [l, s] : dist_->finish_curvature(loss_scale_)) record_.committed(static_cast<int>(l), s, t);
    stamp(Kind::SYNC_CURV, -1, t0);
  }
  if (inversion) {
    dist_->invert_all();
    for (int l = 0; l < layers(); ++l)
      for (Side s : {Side::A, Side::B})
        if (record_.has_factor(l, s)) record_.inverted(l, s, -1);
  }
  precondition(t);
}

// Profiling: every factor's curvature from the saved buffers, unit by unit, each timed.
void ChunkKfac::profiled_curvature(ChunkKfacTimes& times) {
  const int L = layers();
  times.curv_a.resize(L, 0), times.curv_b.resize(L, 0);
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B}) {
      const int64_t t0 = comm::steady_now_ns();
      for (int k = 0; k < saved_.slots(); ++k) pre_->curvature(l, s, saved_.data(l, s, k), saved_.rows(l, s, k));
      (s == Side::A ? times.curv_a : times.curv_b)[l] += ms_since(t0) / saved_.slots();
      stamp(curvature_kind(side_index(s)), l, t0);
    }
  ++times.curv_samples;
}

// The step's factors committed, summed over the stage's copies by `sum` when given.
void ChunkKfac::inline_commit(int64_t t, const FactorSum& sum, ChunkKfacTimes* times) {
  const int L = layers();
  std::vector<float> rows;
  if (sum) {
    const int64_t t0 = comm::steady_now_ns();
    rows = sum();
    if (times) times->sync += ms_since(t0);
    stamp(Kind::SYNC_CURV, -1, t0);
  } else {
    for (int l = 0; l < L; ++l)
      for (Side s : {Side::A, Side::B}) rows.push_back(factor_rows(*pre_, l, s));
  }
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B}) {
      const int64_t t0 = comm::steady_now_ns();  // the running average's update: curvature work too
      if (commit_summed(*pre_, l, s, loss_scale_, rows[2 * l + side_index(s)])) record_.committed(l, s, t);
      stamp(curvature_kind(side_index(s)), l, t0);
    }
}

// Every factor inverted whole, each timed with `times`.
void ChunkKfac::inline_invert(ChunkKfacTimes* times) {
  const int L = layers();
  for (Side s : {Side::A, Side::B})
    for (int l = 0; l < L; ++l) {
      const int64_t t0 = comm::steady_now_ns();
      invert(s, l, -1);
      stamp(inversion_kind(side_index(s)), l, t0);
      if (times) {
        times->inv_a.resize(L, 0), times->inv_b.resize(L, 0);
        (s == Side::A ? times->inv_a : times->inv_b)[l] += ms_since(t0);
      }
    }
  if (times) ++times->inv_samples;
}

void ChunkKfac::inline_refresh(int64_t t, bool curvature, bool inversion, const FactorSum& sum, ChunkKfacTimes* times) {
  inline_units_.clear();
  if (dist_) {
    PF_CHECK(!times, "a profiled inline refresh (bubbles) through the DistributedKfac");
    distributed_refresh(t, curvature, inversion);
    return;
  }
  if (curvature) {
    attach(false);
    if (times) profiled_curvature(*times);
    inline_commit(t, sum, times);
  }
  if (inversion) inline_invert(times);
  const int64_t t0 = comm::steady_now_ns();
  precondition(t);
  if (times) times->prec += ms_since(t0), ++times->prec_samples;
}

void ChunkKfac::set_replicated(MPI_Comm comm) {
  // Inversions of a cycle may run while the next cycle's curvature accumulates (Chimera's group).
  for (int l = 0; l < layers(); ++l)
    for (Side s : {Side::A, Side::B}) pre_->layer(l).factor(s).set_own_accumulator(overlap_ && comm != MPI_COMM_NULL);
  sync_.set(comm, *pre_);
}

void ChunkKfac::broadcast(Side s, int layer, int block, int owner) {
  sync_.broadcast(pre_->layer(layer).factor(s), layer, s, block, owner);
}

void ChunkKfac::commit_synced(const std::vector<float>& rows) {
  const int L = layers();
  // The previous cycle's inverses (built from the factors committed now, before this commit):
  // NCT pieces this replica inverted itself, CT pieces inverted here or received by BCAST_INV.
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B})
      if (sync_.install(pre_->layer(l).factor(s), l, s)) record_.inverted(l, s, -1);
  sync_.end_cycle();
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B})
      if (commit_summed(*pre_, l, s, loss_scale_, rows[2 * l + side_index(s)])) record_.committed(l, s, cycle_step_);
}

void ChunkKfac::split(int layer, Side s, int blocks, int64_t t) {
  pre_->layer(layer).factor(s).set_blocks(blocks);
  record_.split(layer, s, blocks, t);
}

}  // namespace pf
