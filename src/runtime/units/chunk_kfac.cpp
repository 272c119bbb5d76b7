#include "runtime/units/chunk_kfac.hpp"

#include "comm/clock.hpp"
#include "comm/collectives.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/triangle.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "dkfac/factor_sum.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

namespace pf {

namespace {
// Milliseconds from t0 (comm::steady_now_ns) to now.
double ms_since(int64_t t0) { return static_cast<double>(comm::steady_now_ns() - t0) / 1e6; }
}  // namespace

ChunkKfac::ChunkKfac(Model& model, const Config& cfg, int replica, int micro_batches, std::vector<int> slot_of,
                     int64_t rows, bool planned, bool overlap)
    : cfg_(cfg),
      pre_(std::make_unique<KfacPreconditioner>(model.linears(), cfg.kfac, cfg.model.vocab)),
      overlap_(overlap),
      saved_(*pre_, replica, micro_batches, std::move(slot_of), rows, planned) {
  const int L = layers();
  curv_count_.assign(L, {0, 0});
  committed_.assign(L, {-1, -1});
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
  if (saving_) take_over_cycle(), saved_.save(i, Side::A, micro_batch, x, rows, cols);
  if (tapping_ && dist_) dist_->on_input(l, micro_batch, x, rows, cols);
  else if (tapping_) pre_->curvature(i, Side::A, x, rows);
}

void ChunkKfac::on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t cols) {
  const int i = pre_->index_of(l);
  if (i < 0) return;
  if (saving_) take_over_cycle(), saved_.save(i, Side::B, micro_batch, g, rows, cols);
  if (tapping_ && dist_) dist_->on_grad_output(l, micro_batch, g, rows, cols);
  else if (tapping_) pre_->curvature(i, Side::B, g, rows);
}

void ChunkKfac::committed(int layer, Side s, int64_t step) { committed_[layer][side_index(s)] = step; }

void ChunkKfac::curvature(Side s, int layer, int m) {
  const int k = saved_.slot(m);
  if (poisoned_) return;  // the cycle's step was non-finite: no curvature from it (discard_step)
  pre_->curvature(layer, s, saved_.data(layer, s, k), saved_.rows(layer, s, k));
  // The cycle's last micro-batch of this factor: commit (scaled by the convention).
  if (++curv_count_[layer][side_index(s)] == saved_.slots()) {
    curv_count_[layer][side_index(s)] = 0;
    if (sync_comm_ != MPI_COMM_NULL) return;  // committed at SYNC_CURV
    if (pre_->finish_curvature(layer, s, loss_scale_)) committed(layer, s, cycle_step_);
  }
}

void ChunkKfac::invert(Side s, int layer, int block) {
  if (committed_[layer][side_index(s)] < 0) return;  // nothing to invert yet
  KfacLayer& kl = pre_->layer(layer);
  KfacFactor& f = kl.factor(s);
  if (sync_comm_ != MPI_COMM_NULL) stash_ = f.inverse();  // the inverse in use stays until SYNC_CURV
  if (block < 0) pre_->invert(layer, s);
  else kl.invert_block(s, block, cfg_.kfac.damping);
  if (sync_comm_ == MPI_COMM_NULL) {
    // A whole inversion supersedes the factor's block inversions (a re-profile right after a
    // cycle's wrapped block inversions, in the same step): the record must not replay them after it.
    if (block < 0)
      for (auto* m : {&inverse_, &used_})
        std::erase_if(*m, [&](const auto& e) {
          return std::get<0>(e.first) == layer && std::get<1>(e.first) == side_index(s) && std::get<2>(e.first) >= 0;
        });
    inverse_[{layer, side_index(s), block}] = {committed_[layer][side_index(s)], committed_[layer][side_index(other_side(s))]};
    return;
  }
  // Set the fresh piece aside for the broadcast; put the one in use back.
  Tensor& out = pending_[layer][side_index(s)];
  const Tensor& in = f.inverse();
  const int64_t d = f.dim();
  const int64_t first = block < 0 ? 0 : f.blocks()[block].offset, size = block < 0 ? d : f.blocks()[block].size;
  if (f.diagonal())
    std::memcpy(out.data() + first, in.data() + first, static_cast<size_t>(size) * sizeof(float));
  else
    for (int64_t r = first; r < first + size; ++r)
      std::memcpy(out.data() + r * d + first, in.data() + r * d + first, static_cast<size_t>(size) * sizeof(float));
  flags_[2 * layer + side_index(s)] += 1.0f;
  f.received_inverse() = stash_;
}

void ChunkKfac::precondition(int64_t t) {
  if (!gather_.split()) {
    pre_->precondition_all();
  } else {
    for (int l = 0; l < layers(); ++l)
      if (gather_.mine(l)) pre_->precondition(l);
    gather_.start(*pre_);
  }
  preconditioned_ = true;
  for (auto& [key, id] : inverse_) {
    auto it = used_.find(key);
    if (it != used_.end() && it->second == id) continue;
    used_[key] = id;
    events_.push_back({pre_->layer(std::get<0>(key)).name(), std::get<1>(key), std::get<2>(key), t, id});
  }
}

void ChunkKfac::set_prec_split(std::vector<int> owner, MPI_Comm comm) { gather_.set(std::move(owner), comm, *pre_); }

void ChunkKfac::finish_gather() { gather_.finish(*pre_); }

// One inline K-FAC unit, as the profiler and trace show it: from t0 to now.
void ChunkKfac::stamp(Kind k, int layer, int64_t t0) { inline_units_.push_back({k, layer, t0, comm::steady_now_ns()}); }

// Several holders, inline / skip: the DistributedKfac sums the factors and inverts.
void ChunkKfac::distributed_refresh(int64_t t, bool curvature, bool inversion) {
  attach(false);
  if (curvature) {
    const auto t0 = comm::steady_now_ns();
    for (const auto& [l, s] : dist_->finish_curvature(loss_scale_)) committed(static_cast<int>(l), s, t);
    stamp(Kind::SYNC_CURV, -1, t0);
  }
  if (inversion) {
    dist_->invert_all();
    for (int l = 0; l < layers(); ++l)
      for (Side s : {Side::A, Side::B})
        if (committed_[l][side_index(s)] >= 0)
          inverse_[{l, side_index(s), -1}] = {committed_[l][side_index(s)], committed_[l][side_index(other_side(s))]};
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

// The step's factors committed, summed over the stage's copies (`holders`) when not null.
void ChunkKfac::inline_commit(int64_t t, MPI_Comm holders, ChunkKfacTimes* times) {
  const int L = layers();
  std::vector<float> rows;
  if (holders != MPI_COMM_NULL) {
    const int64_t t0 = comm::steady_now_ns();
    rows = sum_factors_over_copies(*pre_, holders, true);
    if (times) times->sync += ms_since(t0);
    stamp(Kind::SYNC_CURV, -1, t0);
  } else {
    for (int l = 0; l < L; ++l)
      for (Side s : {Side::A, Side::B}) rows.push_back(factor_rows(*pre_, l, s));
  }
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B}) {
      const int64_t t0 = comm::steady_now_ns();  // the running average's update: curvature work too
      if (commit_summed(*pre_, l, s, loss_scale_, rows[2 * l + side_index(s)])) committed(l, s, t);
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

void ChunkKfac::inline_refresh(int64_t t, bool curvature, bool inversion, MPI_Comm holders, ChunkKfacTimes* times) {
  inline_units_.clear();
  if (dist_) {
    PF_CHECK(!times, "a profiled inline refresh (bubbles) through the DistributedKfac");
    distributed_refresh(t, curvature, inversion);
    return;
  }
  if (curvature) {
    attach(false);
    if (times) profiled_curvature(*times);
    inline_commit(t, holders, times);
  }
  if (inversion) inline_invert(times);
  const int64_t t0 = comm::steady_now_ns();
  precondition(t);
  if (times) times->prec += ms_since(t0), ++times->prec_samples;
}

void ChunkKfac::set_replicated(MPI_Comm comm) {
  sync_comm_ = comm;
  // Inversions of a cycle may run while the next cycle's curvature accumulates (Chimera's group).
  for (int l = 0; l < layers(); ++l)
    for (Side s : {Side::A, Side::B}) pre_->layer(l).factor(s).set_own_accumulator(overlap_ && comm != MPI_COMM_NULL);
  pending_.clear();
  if (comm == MPI_COMM_NULL) return;
  for (int l = 0; l < layers(); ++l)
    pending_.push_back({Tensor(pre_->layer(l).a().inverse().shape()), Tensor(pre_->layer(l).b().inverse().shape())});
  flags_ = Tensor(Shape{2 * static_cast<int64_t>(layers())});
}

// A CT piece: its owner (the holder `owner`, a world rank) sends the piece it inverted last
// cycle, upper triangle (a diagonal factor: its entries) plus a flag (0: nothing inverted yet);
// the others keep it with their own NCT pieces until the SYNC_CURV that follows installs them all.
void ChunkKfac::broadcast(Side s, int layer, int block, int owner) {
  PF_CHECK(sync_comm_ != MPI_COMM_NULL, "BCAST_INV outside replicated bubbles");
  int me = 0, root = MPI_UNDEFINED;
  MPI_Comm_rank(sync_comm_, &me);
  MPI_Group world, holders;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Comm_group(sync_comm_, &holders);
  MPI_Group_translate_ranks(world, 1, &owner, holders, &root);
  MPI_Group_free(&world);
  MPI_Group_free(&holders);
  PF_CHECK(root != MPI_UNDEFINED, "BCAST_INV: rank {} holds no copy of this stage", owner);
  KfacFactor& f = pre_->layer(layer).factor(s);
  Tensor& piece = pending_[layer][side_index(s)];
  const int64_t d = f.dim();
  const int64_t first = block < 0 ? 0 : f.blocks()[block].offset, size = block < 0 ? d : f.blocks()[block].size;
  std::vector<float> buf(static_cast<size_t>(f.diagonal() ? size : triangle_size(size)) + 1);
  float* x = buf.data();
  if (me == root) {
    if (f.diagonal()) x = std::copy_n(piece.data() + first, size, x);
    else x = pack_triangle(piece.data(), d, first, size, x);
    *x = flags_[2 * layer + side_index(s)] > 0 ? 1.0f : 0.0f;
  }
  comm::check(MPI_Bcast(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, root, sync_comm_), "MPI_Bcast(inverse)");
  if (me == root || buf.back() == 0.0f) return;
  x = buf.data();
  if (f.diagonal()) std::copy_n(x, size, piece.data() + first);
  else unpack_triangle(x, piece.data(), d, first, size, true);
  flags_[2 * layer + side_index(s)] += 1.0f;
}

void ChunkKfac::sync(int64_t t) {
  const int L = layers();
  // A poisoned cycle adds no factors (every holder alike); the row counts still meet.
  const std::vector<float> rows = sum_factors_over_copies(*pre_, sync_comm_, !poisoned_);
  // The previous cycle's inverses (built from the factors committed now, before this commit):
  // NCT pieces this replica inverted itself, CT pieces inverted here or received by BCAST_INV.
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B}) {
      if (flags_[2 * l + side_index(s)] > 0) {
        // Block by block: a split factor's off-block entries keep what they held, as a local
        // inversion of its blocks leaves them.
        KfacFactor& f = pre_->layer(l).factor(s);
        const Tensor& in = pending_[l][side_index(s)];
        Tensor& out = f.received_inverse();
        const int64_t d = f.dim();
        if (f.diagonal()) out = in;
        else
          for (const FactorBlock& b : f.blocks())
            for (int64_t r = b.offset; r < b.offset + b.size; ++r)
              std::memcpy(out.data() + r * d + b.offset, in.data() + r * d + b.offset,
                          static_cast<size_t>(b.size) * sizeof(float));
        inverse_[{l, side_index(s), -1}] = {committed_[l][side_index(s)], committed_[l][side_index(other_side(s))]};
      }
      pending_[l][side_index(s)].zero();
    }
  flags_.zero();
  for (int l = 0; l < L; ++l)
    for (Side s : {Side::A, Side::B})
      if (commit_summed(*pre_, l, s, loss_scale_, rows[2 * l + side_index(s)])) committed(l, s, cycle_step_);
}

void ChunkKfac::split(int layer, Side s, int blocks, int64_t t) {
  pre_->layer(layer).factor(s).set_blocks(blocks);
  splits_.push_back({pre_->layer(layer).name(), side_index(s), blocks, t});
}

}  // namespace pf
