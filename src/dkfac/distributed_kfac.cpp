#include "dkfac/distributed_kfac.hpp"

#include "comm/clock.hpp"
#include "comm/wait.hpp"
#include "dkfac/factor_sum.hpp"
#include "core/error.hpp"
#include "core/triangle.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace pf {

namespace {

double now_s() { return static_cast<double>(comm::steady_now_ns()) / 1e9; }


// Length of the union of intervals [a, b].
double union_length(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  double total = 0, lo = 0, hi = -1;
  for (auto [a, b] : v) {
    if (a > hi) {
      if (hi > lo) total += hi - lo;
      lo = a, hi = b;
    } else {
      hi = std::max(hi, b);
    }
  }
  if (hi > lo) total += hi - lo;
  return total;
}

}  // namespace

DkfacOptions dkfac_options(const KfacConfig& cfg) {
  DkfacOptions o;
  o.strategy = cfg.distributed;
  o.pipelining = cfg.distributed == KfacStrategy::SpdKfac && cfg.spd_pipelining;
  o.balance = cfg.distributed == KfacStrategy::SpdKfac && cfg.spd_balance;
  return o;
}

DistributedKfac::DistributedKfac(KfacPreconditioner& kfac, MPI_Comm factor_comm, MPI_Comm inverse_comm,
                                 const comm::PerfModel& model, const DkfacOptions& opt)
    : kfac_(kfac), factor_comm_(factor_comm), inverse_comm_(inverse_comm), model_(model), opt_(opt) {
  MPI_Comm_rank(factor_comm, &rank_);
  MPI_Comm_size(factor_comm, &size_);
  use_pipelining_ = opt.strategy == KfacStrategy::SpdKfac && opt.pipelining;
  use_balance_ = opt.strategy == KfacStrategy::SpdKfac && opt.balance;
  // Factors: A then B of each layer (index 2 * layer + side).
  std::vector<int64_t> cost_dims;
  for (size_t i = 0; i < kfac.size(); ++i)
    for (Side s : {Side::A, Side::B}) {
      const KfacFactor& kf = kfac.layer(i).factor(s);
      Factor f;
      f.layer = i;
      f.side = s;
      f.dim = kf.dim();
      f.diagonal = kf.diagonal();
      if (f.diagonal) {
        f.elems = f.dim;
      } else {
        for (const FactorBlock& b : kf.blocks()) f.elems += triangle_size(b.size);
      }
      factors_.push_back(f);
      cost_dims.push_back(f.diagonal ? 1 : f.dim);  // a diagonal inverse costs O(d): never worth a broadcast
    }
  const auto inv = [&](int64_t d) { return model_.invert(d); };
  const auto bcast = [&](int64_t d) { return model_.broadcast_sym(d); };
  if (opt.strategy == KfacStrategy::DKfac || size_ == 1) {
    placement_ = place_load_balanced(cost_dims, 1, inv, bcast);  // everything on "every rank"
    placement_.load.assign(static_cast<size_t>(size_), placement_.load.empty() ? 0.0 : placement_.load[0]);
  } else if (use_balance_) {
    placement_ = place_load_balanced(cost_dims, size_, inv, bcast);
  } else {
    std::vector<int> layer_of;  // Eq. 22 by layer: a layer's A and B on one rank
    for (const Factor& f : factors_) layer_of.push_back(static_cast<int>(f.layer));
    placement_ = place_round_robin(cost_dims, size_, inv, bcast, layer_of);
  }
  // The broadcast staging: one slot per communicated inverse, allocated once.
  bcast_offset_.assign(factors_.size(), 0);
  size_t total = 0;
  for (size_t f = 0; f < factors_.size(); ++f)
    if (placement_.owner[f] != kEveryRank) bcast_offset_[f] = total, total += static_cast<size_t>(factors_[f].elems);
  bcast_buf_.assign(total, 0.0f);
  ready_now_.assign(factors_.size(), 0.0);
  for (Sequence& q : seq_) q.pos.assign(factors_.size(), -1);
  // The after-backward messages: A in layer order, then B in reverse layer order.
  std::vector<int> flat_order;
  for (size_t i = 0; i < kfac.size(); ++i) flat_order.push_back(factor_index(i, Side::A));
  for (size_t i = kfac.size(); i-- > 0;) flat_order.push_back(factor_index(i, Side::B));
  std::vector<int64_t> elems;
  for (int f : flat_order) elems.push_back(factors_[f].elems);
  for (const FusionGroup& g : plan_threshold(elems, opt.fuse_limit)) {
    Group m;
    int64_t n = 0;
    for (int k = g.first; k <= g.last; ++k) m.factors.push_back(flat_order[k]), n += factors_[flat_order[k]].elems + 1;
    m.buf.assign(static_cast<size_t>(n), 0.0f);
    flat_.push_back(std::move(m));
  }
}

DistributedKfac::~DistributedKfac() {
  // Nothing may stay in flight on buffers about to be freed.
  for (auto* v : {&groups_[0], &groups_[1], &flat_})
    for (Group& g : *v)
      if (g.req != MPI_REQUEST_NULL) MPI_Wait(&g.req, MPI_STATUS_IGNORE);
}

void DistributedKfac::begin_step(int last_micro_batch) {
  snapshot_ = save_state().dump();
  last_mb_ = last_micro_batch;
  pipelined_now_ = use_pipelining_ && curvature_steps_ >= opt_.profile_steps && size_ > 1;
  for (Sequence& q : seq_) q.complete = -1, q.next_group = 0;
  for (auto& v : first_seen_) v.clear();
  for (auto* v : {&groups_[0], &groups_[1], &flat_})
    for (Group& g : *v) g.posted = g.done = false;
  std::fill(ready_now_.begin(), ready_now_.end(), -1.0);
}

void DistributedKfac::on_input(const Linear& l, int micro_batch, const float* x, int64_t rows, int64_t) {
  tap(l, Side::A, micro_batch, x, rows);
}

void DistributedKfac::on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t) {
  tap(l, Side::B, micro_batch, g, rows);
}

void DistributedKfac::tap(const Linear& l, Side s, int micro_batch, const float* x, int64_t rows) {
  const int i = kfac_.index_of(l);
  PF_CHECK(i >= 0, "dkfac tap on '{}', not a K-FAC layer", l.name());
  kfac_.curvature(static_cast<size_t>(i), s, x, rows);
  if (micro_batch == last_mb_) {
    const int f = factor_index(static_cast<size_t>(i), s);
    ready_now_[f] = now_s();
    first_seen_[side_index(s)].push_back(f);
    if (pipelined_now_) {
      // The first B of the last backward: the forward is over, every A is final.
      if (s == Side::B && seq_[0].next_group < seq_[0].groups.size()) post_ready(seq_[0], static_cast<int>(factors_.size()));
      post_ready(seq_[side_index(s)], -1);
    }
  }
  progress();
}

// Posts, in plan order, the groups whose factors have all finished their last micro-batch
// (all_complete: a position at or past the end marks every factor complete).
void DistributedKfac::post_ready(Sequence& q, int all_complete) {
  std::vector<Group>& gs = groups_[&q == &seq_[0] ? 0 : 1];
  while (q.next_group < q.groups.size()) {
    Group& g = gs[q.next_group];
    if (all_complete < 0)
      for (int f : g.factors)
        if (ready_now_[f] < 0) return;
    post(g);
    ++q.next_group;
  }
}

void DistributedKfac::pack(const Factor& f, float* out) const {
  KfacFactor& kf = kfac_.layer(f.layer).factor(f.side);
  const float* v = kf.accumulator().data();
  if (f.diagonal) {
    std::copy(v, v + f.dim, out);
    return;
  }
  for (const FactorBlock& b : kf.blocks()) out = pack_triangle(v, f.dim, b.offset, b.size, out);
}

void DistributedKfac::unpack_sum(const Factor& f, const float* in) {
  KfacFactor& kf = kfac_.layer(f.layer).factor(f.side);
  float* v = kf.accumulator().data();
  if (f.diagonal) {
    std::copy(in, in + f.dim, v);
    return;
  }
  for (const FactorBlock& b : kf.blocks()) in = unpack_triangle(in, v, f.dim, b.offset, b.size, false);  // commit mirrors it
}

void DistributedKfac::post(Group& g) {
  float* p = g.buf.data();
  for (int f : g.factors) {
    pack(factors_[f], p);
    p += factors_[f].elems;
  }
  for (int f : g.factors)  // the local row counts, exact in float below 2^24
    *p++ = factor_rows(kfac_, factors_[f].layer, factors_[f].side);
  comm::check(MPI_Iallreduce(MPI_IN_PLACE, g.buf.data(), static_cast<int>(g.buf.size()), MPI_FLOAT, MPI_SUM,
                             factor_comm_, &g.req),
              "MPI_Iallreduce(K-FAC factors)");
  g.posted = true;
  g.t_post = now_s();
}

void DistributedKfac::test_groups() {
  for (auto* v : {&groups_[0], &groups_[1], &flat_})
    for (Group& g : *v) {
      if (!g.posted || g.done) continue;
      int flag = 0;
      comm::check(MPI_Test(&g.req, &flag, MPI_STATUS_IGNORE), "MPI_Test(K-FAC factors)");
      if (flag) g.done = true, g.t_done = now_s();
    }
}

void DistributedKfac::progress() {
  test_groups();
  if (hook_) hook_();
}

std::vector<std::pair<size_t, Side>> DistributedKfac::finish_curvature(double loss_scale) {
  std::vector<std::pair<size_t, Side>> committed;
  const bool measured = curvature_steps_ >= opt_.profile_steps;
  std::vector<Group*> msgs;
  if (pipelined_now_) {
    post_ready(seq_[0], static_cast<int>(factors_.size()));
    post_ready(seq_[1], static_cast<int>(factors_.size()));
    for (auto& v : groups_)
      for (Group& g : v) msgs.push_back(&g);
  } else {
    for (Group& g : flat_) post(g), msgs.push_back(&g);
  }
  // Wait in posting order (the order every rank posted them), timing what is not hidden.
  const double w0 = now_s();
  for (Group* g : msgs) {
    if (!g->done) {
      comm::wait(g->req, {"K-FAC factor all-reduce", factor_comm_, -1});
      g->done = true;
      g->t_done = now_s();
    }
    if (hook_) hook_();
  }
  const double waited = now_s() - w0;
  if (measured) {
    std::vector<std::pair<double, double>> spans;
    for (Group* g : msgs) spans.emplace_back(g->t_post, g->t_done);
    times_.factor_inflight += union_length(spans);
    times_.factor_wait += waited;
    times_.factor_messages += static_cast<double>(msgs.size());
    ++times_.steps;
  }
  for (Group* g : msgs) {
    const float* p = g->buf.data();
    for (int f : g->factors) unpack_sum(factors_[f], p), p += factors_[f].elems;
    for (int f : g->factors) {
      const Factor& fa = factors_[f];
      if (commit_summed(kfac_, fa.layer, fa.side, loss_scale, *p++))
        committed.emplace_back(fa.layer, fa.side);
    }
  }
  ++curvature_steps_;
  // Profile steps: remember when each factor was ready (rank 0's order is the plan's).
  if (use_pipelining_ && size_ > 1 && curvature_steps_ <= opt_.profile_steps) profile_readiness();
  return committed;
}

// A profile step's readiness: the order factors became ready in (rank 0's, broadcast on the
// first step), and their ready times summed by position; the fusion plan at the last step.
void DistributedKfac::profile_readiness() {
  if (seq_[0].order.empty()) {
    for (int side = 0; side < 2; ++side) {
      Sequence& q = seq_[side];
      std::vector<int> order = first_seen_[side];
      int n = static_cast<int>(order.size());
      MPI_Bcast(&n, 1, MPI_INT, 0, factor_comm_);
      order.resize(static_cast<size_t>(n));
      MPI_Bcast(order.data(), n, MPI_INT, 0, factor_comm_);
      std::vector<bool> seen(factors_.size(), false);
      for (int f : order) seen[f] = true;
      for (size_t f = 0; f < factors_.size(); ++f)  // never seen on rank 0: last (posted at the end)
        if (factors_[f].side == side_at(side) && !seen[f]) order.push_back(static_cast<int>(f));
      q.order = order;
      for (size_t p = 0; p < order.size(); ++p) q.pos[order[p]] = static_cast<int>(p);
      q.ready_sum.assign(order.size(), 0.0);
    }
  }
  // Step 0 pays first-touch costs: skip it when later profile steps exist.
  if (curvature_steps_ > 1 || opt_.profile_steps == 1)
    for (Sequence& q : seq_) {
      double origin = -1, last = 0;
      for (size_t p = 0; p < q.order.size(); ++p) {
        double t = ready_now_[q.order[p]];
        if (t < 0) t = last;  // not seen here: as ready as its predecessor
        if (origin < 0) origin = t;
        q.ready_sum[p] += t - origin;
        last = t;
      }
    }
  if (curvature_steps_ == opt_.profile_steps) make_plan();
}

void DistributedKfac::make_plan() {
  for (int side = 0; side < 2; ++side) {
    Sequence& q = seq_[side];
    std::vector<double> ready = q.ready_sum;
    MPI_Allreduce(MPI_IN_PLACE, ready.data(), static_cast<int>(ready.size()), MPI_DOUBLE, MPI_SUM, factor_comm_);
    const double n = static_cast<double>(size_) * std::max(1, opt_.profile_steps - 1);
    for (double& r : ready) r /= n;
    // Rank 0's numbers for everyone: sums of doubles may differ in the last bit between ranks.
    MPI_Bcast(ready.data(), static_cast<int>(ready.size()), MPI_DOUBLE, 0, factor_comm_);
    std::vector<int64_t> elems;
    for (int f : q.order) elems.push_back(factors_[f].elems);
    q.groups = plan_fusion(ready, elems, model_.allreduce);
  }
  rebuild_groups();
  if (rank_ == 0)
    spdlog::info("spd-kfac: factor all-reduces fused into {} A and {} B messages ({} A and {} B factors)",
                 seq_[0].groups.size(), seq_[1].groups.size(), seq_[0].order.size(), seq_[1].order.size());
}

void DistributedKfac::rebuild_groups() {
  for (int side = 0; side < 2; ++side) {
    const Sequence& q = seq_[side];
    groups_[side].clear();
    for (const FusionGroup& fg : q.groups) {
      Group g;
      int64_t m = 0;
      for (int p = fg.first; p <= fg.last; ++p) g.factors.push_back(q.order[p]), m += factors_[q.order[p]].elems + 1;
      g.buf.assign(static_cast<size_t>(m), 0.0f);
      groups_[side].push_back(std::move(g));
    }
  }
}

nlohmann::json DistributedKfac::save_state() const {
  nlohmann::json seqs = nlohmann::json::array();
  for (const Sequence& q : seq_) {
    nlohmann::json groups = nlohmann::json::array();
    for (const FusionGroup& g : q.groups) groups.push_back({g.first, g.last, g.begin, g.end});
    seqs.push_back({{"order", q.order}, {"ready_sum", q.ready_sum}, {"groups", groups}});
  }
  return {{"curvature_steps", curvature_steps_}, {"sequences", seqs}};
}

void DistributedKfac::load_state(const nlohmann::json& j) {
  curvature_steps_ = j.at("curvature_steps").get<int>();
  for (int side = 0; side < 2; ++side) {
    const nlohmann::json& js = j.at("sequences").at(side);
    Sequence& q = seq_[side];
    q.order = js.at("order").get<std::vector<int>>();
    q.ready_sum = js.at("ready_sum").get<std::vector<double>>();
    q.pos.assign(factors_.size(), -1);
    for (size_t p = 0; p < q.order.size(); ++p) {
      PF_CHECK(q.order[p] >= 0 && static_cast<size_t>(q.order[p]) < factors_.size(), "dkfac state: factor {} of {}",
               q.order[p], factors_.size());
      q.pos[q.order[p]] = static_cast<int>(p);
    }
    q.groups.clear();
    for (const nlohmann::json& g : js.at("groups")) {
      FusionGroup fg{g.at(0).get<int>(), g.at(1).get<int>(), g.at(2).get<double>(), g.at(3).get<double>()};
      PF_CHECK(fg.first >= 0 && fg.first <= fg.last && static_cast<size_t>(fg.last) < q.order.size(),
               "dkfac state: group [{}, {}] of {} factors", fg.first, fg.last, q.order.size());
      q.groups.push_back(fg);
    }
  }
  rebuild_groups();
}

void DistributedKfac::discard_step() {
  if (!snapshot_.empty()) load_state(nlohmann::json::parse(snapshot_));
}

// The inverses other ranks inverted and broadcast, from the staging buffer into the factors.
void DistributedKfac::install_received(const std::vector<int>& received) {
  for (int f : received) {
    const Factor& fa = factors_[f];
    KfacFactor& kf = kfac_.layer(fa.layer).factor(fa.side);
    float* v = kf.received_inverse().data();
    const float* in = bcast_buf_.data() + bcast_offset_[f];
    if (fa.diagonal) {
      std::copy(in, in + fa.dim, v);
      continue;
    }
    for (const FactorBlock& b : kf.blocks()) in = unpack_triangle(in, v, fa.dim, b.offset, b.size, true);
  }
}

InversionSummary DistributedKfac::invert_all() {
  InversionSummary sum;
  std::vector<MPI_Request> reqs;
  std::vector<int> received;
  double inv_time = 0;
  for (int f : placement_.order) {
    const Factor& fa = factors_[f];
    const int owner = placement_.owner[f];
    if (owner == kEveryRank || owner == rank_) {
      const double t0 = now_s();
      const InvertResult r = kfac_.invert(fa.layer, fa.side);
      inv_time += now_s() - t0;
      ++sum.factors;
      sum.retries += r.retries;
      if (r.status == InvertStatus::Raised) ++sum.raised;
      if (!r.ok()) ++sum.kept;
    }
    if (owner == kEveryRank) continue;
    float* slot = bcast_buf_.data() + bcast_offset_[f];
    if (owner == rank_) {
      const KfacFactor& kf = kfac_.layer(fa.layer).factor(fa.side);
      const float* v = kf.inverse().data();
      if (fa.diagonal) {
        std::copy(v, v + fa.dim, slot);
      } else {
        float* out = slot;
        for (const FactorBlock& b : kf.blocks()) out = pack_triangle(v, fa.dim, b.offset, b.size, out);
      }
    } else {
      received.push_back(f);
    }
    reqs.emplace_back();
    comm::check(MPI_Ibcast(slot, static_cast<int>(fa.elems), MPI_FLOAT, owner, inverse_comm_, &reqs.back()),
                "MPI_Ibcast(K-FAC inverse)");
    // Let the posted broadcasts (and the gradient all-reduce) advance between inversions.
    int flag = 0;
    comm::check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (hook_) hook_();
  }
  const double w0 = now_s();
  comm::wait_all(reqs, {"K-FAC inverse broadcast", inverse_comm_, -1});
  times_.inverse_wait += now_s() - w0;
  times_.inversion += inv_time;
  ++times_.inversion_steps;
  install_received(received);
  if (sum.raised + sum.kept > 0)
    spdlog::warn("kfac: {} of the {} factors rank {} inverted were not positive definite with damping {:g}: {} "
                 "inverted with raised damping, {} kept their previous inverse",
                 sum.raised + sum.kept, sum.factors, rank_, kfac_.config().damping, sum.raised, sum.kept);
  return sum;
}

}  // namespace pf
