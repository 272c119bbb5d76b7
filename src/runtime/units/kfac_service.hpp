#pragma once
// One K-FAC service per stage group. The holders of a stage (its data-parallel replicas and
// Chimera's twin; the whole model with parallel.stages = 1) share the stage's K-FAC through it,
// whichever placement runs: on each rank the service of a hosted chunk is the K-FAC part of the
// chunk's record (HostedChunk::kfac) and its one writer. It owns
//   - the chunk's factors and work units (ChunkKfac, chunk_kfac.hpp);
//   - the group's communicators (made in stage order on every member: connect);
//   - the factor sums among the holders and who inverts what: a whole refresh through the stage's
//     DistributedKfac (SPD-KFAC's Algorithm 1 over the holders, dkfac/distributed_kfac.hpp); the
//     plan's units at the plan's SYNC_CURV (sum_factors) with the pieces its owners inverted, set
//     aside until then (ReplicaSync, replica_sync.hpp; the planner runs Algorithm 1,
//     plan/planner.hpp);
//   - the inverse broadcasts (the DistributedKfac's, or the plan's BCAST_INV through ReplicaSync);
//   - the precondition and its split among the holders (the plan's PrecSplit, PrecGather,
//     prec_gather.hpp).
// A placement refreshes one of two ways (Refresh):
//   whole  inline / skip: the taps accumulate the cadence's curvature during the step, and PREC
//          refreshes the whole chunk (sums, inverts, preconditions): begin_whole_step.
//   units  bubbles / adaptive: the plan's units are sent here one by one (CURV, SYNC_CURV, INV,
//          BCAST_INV, PREC); the layers' inputs and gradients are saved for the cycle's curvature
//          units (M_err^save): begin_units_step, then curvature, sync, invert, broadcast.
#include "comm/collectives.hpp"
#include "comm/perf_model.hpp"
#include "comm/world.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "runtime/kfac_handlers.hpp"
#include "runtime/units/chunk_kfac.hpp"
#include "runtime/units/prec_gather.hpp"
#include "runtime/units/replica_sync.hpp"

#include <memory>
#include <vector>

namespace pf {

struct HostedChunk;
struct MicroBatch;

class KfacService {
 public:
  enum class Refresh { whole, units };
  // The chunk's ChunkKfac over `chunk`'s model (its micro-batch slots; rows: tokens per
  // micro-batch). overlap: Chimera's group (a cycle's inversions may run during the next cycle's
  // curvature).
  KfacService(const HostedChunk& chunk, const Config& cfg, int replica, int micro_batches, int64_t rows,
              Refresh refresh, bool overlap);
  ~KfacService();
  KfacService(const KfacService&) = delete;
  KfacService& operator=(const KfacService&) = delete;

  // Collective over the group (every member calls it for its chunks in stage order): the group's
  // communicators, duplicates of `base` (the holders of the stage).
  void connect(MPI_Comm base);
  // whole, several holders: the stage's DistributedKfac (kfac.distributed), its factors complete
  // at the chunk's last backward (of the chunk's record); grad_sync: advanced at its progress points.
  void share(const HostedChunk& chunk, const comm::PerfModel& model, const DkfacOptions& opt);

  ChunkKfac& chunk() { return *chunk_; }
  const ChunkKfac& chunk() const { return *chunk_; }
  MPI_Comm holders() const { return holders_.get(); }
  int holders_size() const { return holders_.size(); }
  DistributedKfac* distributed() { return dist_.get(); }
  const DistributedKfac* distributed() const { return dist_.get(); }

  // Step start. whole: curvature taps on the cadence's curvature steps, PREC refreshes (its factors
  // complete at the chunk's last backward of `mbs`). units: save the layers' inputs and gradients
  // (a cycle's first step, or profiling); PREC applies the inverses, or with `profile` runs every
  // unit timed into it.
  void begin_whole_step(int64_t step, bool curvature, bool inversion, const std::vector<MicroBatch>& mbs);
  void begin_units_step(int64_t step, bool save, float loss_scale, ChunkKfacTimes* profile);

  // The plan's units (units).
  void curvature(Side s, int layer, int m) { chunk_->curvature(s, layer, m); }
  void invert(Side s, int layer, int block) { chunk_->invert(s, layer, block); }
  void sync(int64_t step);  // SYNC_CURV: the factor sums, inverses switched
  // BCAST_INV: the piece inverted by holder `owner` (world rank; the plan's inverter) to the group.
  void broadcast(Side s, int layer, int block, int owner);
  // The plan's decisions, at its first step (several holders): factors committed at the plan's
  // SYNC_CURV with the owners' inverses; the precondition split as `split` says (null: none).
  void sync_as_planned() { chunk_->set_replicated(holders_.get()); }
  void split_precondition(const PrecSplit* split, const comm::Groups& groups);

  // PREC (once per step: later calls do nothing): what begin_*_step said; returns the K-FAC
  // layers' work it did (an inline refresh's).
  KfacWork precondition(int64_t step);
  bool preconditioned() const { return chunk_->preconditioned(); }
  double raw_grad_sq() const { return raw_grad_sq_; }  // before this step's precondition, squared
  // Waits for the all-gather a split PREC started (if any) and installs the other holders' layers.
  void finish_gather() { gather_.finish(chunk_->pre()); }

 private:
  // What this step's PREC does.
  //   apply     precondition with the inverses in use (the plan's units did the rest)
  //   refresh   whole: commit the step's curvature (when `curvature`), invert (when `inversion`),
  //             precondition; through the DistributedKfac when the group has one
  //   profile   every unit from the saved buffers, each timed into `times`, then precondition
  //             every layer (the planner needs the whole stage's time)
  struct PrecWork {
    enum class Kind { apply, refresh, profile };
    Kind kind = Kind::apply;
    bool curvature = false, inversion = false;  // refresh
    ChunkKfacTimes* times = nullptr;             // profile
  };

  // The factor sums among the holders, blocking: every factor's accumulator (none with `factors`
  // false) and the row counts; the summed rows. The plan's SYNC_CURV and a profiling step's sum
  // (timed as that unit) take it. A whole refresh with a DistributedKfac sums its own way:
  // all-reduces fused as kfac.distributed plans them, posted during the step's last micro-batch.
  // The two are kept apart because their messages differ in size, and with three or more holders
  // MPI's summation order follows the message size: one way for both would change the bits the
  // pinned runs and same-behaviour hold (and the planner's SYNC_CURV is one unit at one point).
  std::vector<float> sum_factors(bool factors);

  int replica_, micro_batches_;
  // Before chunk_, which outlives neither. sync_: the plan's units with several holders, the
  // pieces set aside until SYNC_CURV; its one writer is chunk_ (they change with the factors, in
  // checkpoints and a skipped step's undo too). gather_: the plan's split precondition.
  ReplicaSync sync_;
  PrecGather gather_;
  int last_backward_mb_ = -1;  // share: the DistributedKfac's factors complete there
  std::unique_ptr<ChunkKfac> chunk_;
  comm::Comm holders_;       // the group (a stream of its own), or none
  comm::Comm inverse_comm_;  // whole with copies: the DistributedKfac's broadcasts
  comm::Comm prec_comm_;     // units with copies: the precondition's all-gathers
  Refresh refresh_;
  PrecWork prec_;            // this step's (begin_*_step)
  double raw_grad_sq_ = 0;
  // Last, so it is destroyed first (it may wait for requests on the communicators).
  std::unique_ptr<DistributedKfac> dist_;
};

}  // namespace pf
