#pragma once
// PipeFisher in the runtime: the K-FAC state of one model chunk (stage copy) on one rank and the
// work units the executor's handlers call (CURV_A / CURV_B / SYNC_CURV / INV_A / INV_B /
// BCAST_INV_A / BCAST_INV_B / PREC). runtime/README.md maps the path from action to unit.
//
// What a chunk does in a step is its placement's decision (runtime/kfac_placement.hpp): inline and
// skip tap curvature during the step and refresh at PREC (inline_refresh), the cadence's way;
// PipeFisher's controller (runtime/pipefisher/controller.hpp) profiles the units at PREC, then
// runs them where its plan puts them (curvature, invert, sync, broadcast) and PREC only applies.
// Re-profiling drops pending inverses of replicated chunks; the record shows the new pattern.
//
// M_err^save (saved_activations.hpp). On the first step of a device's refresh cycle the chunk's
// tap copies every K-FAC layer's inputs and output gradients of every micro-batch into buffers
// allocated once; CURV units of the whole cycle read them. A factor is committed after its last
// CURV of the cycle (W = 1 pipelines only; see below). INV inverts the committed factor (or one
// diagonal block of a split factor) with pi-damping from the traces committed at that moment; the
// new inverse is used by the next PREC; until then the previous one is.
//
// Refresh record (chunk_refresh_record.hpp). Each chunk records, at every PREC, which inverse each
// factor (or block) uses: the step whose micro-batches built the factor and the step of the other
// factor that set pi. Rank 0 writes the changes as out_dir/kfac_refresh.json, so a single-process
// K-FAC loop can follow exactly the same pattern (tests/runtime/kfac_reference.hpp).
//
// Copies of a stage (data-parallel replicas, Chimera's two pipelines): the stage group's
// KfacService (kfac_service.hpp) owns the group's communicators, the factor sums, the pieces set
// aside until SYNC_CURV (ReplicaSync: this chunk's INV and checkpoints write into it) and the
// precondition's split (PrecGather), and alone sets the modes below (set_distributed,
// set_replicated; a checkpoint's load restores them).
// Single-process K-FAC builds each factor over ALL micro-batches of the step, so each copy
// accumulates the factors of its own micro-batches and the copies all-reduce the sums (and row
// counts) before the commit,
// exactly like gradients (own communicator per stage). inline and skip, in every layout: the
// stage's DistributedKfac (dkfac/distributed_kfac.hpp, set_distributed) does it as
// kfac.distributed says (SPD-KFAC: all-reduces posted during the step's last micro-batch, fused;
// inversions placed by Algorithm 1 over the holders and broadcast), finished at the PREC before
// the first OPT, so the copies' inverses and weights stay identical.
//
// bubbles with W > 1 replicas or Chimera: the planner's SYNC_CURV (set_replicated below;
// the service's ReplicaSync, replica_sync.hpp, holds the pieces set aside until it). Chimera's
// twins (devices i and D-1-i) and their replicas form each stage's group: they share a cycle
// (each pair of twins its own), their syncs are pinned at the end of one cycle step, in stage
// order (plan/planner.hpp), so all sum the same micro-batches and switch inverses at the same
// step; each inversion piece is inverted by its owner in the group (or by all: NCT) and
// broadcast to the others, as with replicas. A cycle's inversions may run while the next cycle's
// curvature accumulates, so Chimera's factors sum into buffers of their own (memory: one more
// copy of the factors).
//
// The precondition of a stage with several holders (bubbles, after planning): split by layer as
// the plan's PrecSplit says (the service's PrecGather, prec_gather.hpp: precondition's `mine`).
// Profiling steps precondition every layer (the plan needs the whole stage's time).
#include "comm/world.hpp"
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "kfac/preconditioner.hpp"
#include "kfac/refresh_record.hpp"
#include "nn/model.hpp"
#include "plan/planner.hpp"
#include "runtime/units/chunk_refresh_record.hpp"
#include "runtime/units/replica_sync.hpp"
#include "runtime/units/saved_activations.hpp"

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace pf {

class DistributedKfac;

// Measured costs of one chunk's K-FAC units (sums; counts alongside), ms.
struct ChunkKfacTimes {
  std::vector<double> curv_a, curv_b, inv_a, inv_b;  // [layer]
  double prec = 0;
  double sync = 0;  // the factor sum among the stage's copies (W > 1)
  int curv_samples = 0, inv_samples = 0, prec_samples = 0;
};

class ChunkKfac final : public LinearTap {
 public:
  // model: the chunk's model; replica/micro_batches: to map a micro-batch index to the chunk's
  // slot (slot_of[m], m local, -1 = not run here); rows: tokens per micro-batch. saves: the
  // units run where a plan puts them (KfacService::Refresh::units), so the layers' inputs and
  // gradients are saved for them (M_err^save). overlap: when replicated, a cycle's inversions may
  // run during the next cycle's curvature (Chimera's group), so each factor sums into a buffer of
  // its own (one more factor of memory). sync: the service's, which outlives the chunk.
  ChunkKfac(Model& model, const Config& cfg, int replica, int micro_batches, std::vector<int> slot_of, int64_t rows,
            bool saves, bool overlap, ReplicaSync& sync);
  ~ChunkKfac() override;

  KfacPreconditioner& pre() { return *pre_; }
  // Step start. save: copy the layers' inputs/gradients (the cycle's first step, or profiling);
  // taps: accumulate curvature directly (inline / skip curvature steps).
  void begin_step(int64_t t, bool save, bool taps, float loss_scale);
  // Work units (bubbles). m: local micro-batch.
  void curvature(Side s, int layer, int m);
  void invert(Side s, int layer, int block);
  // Precondition every layer, or those `mine` says (this holder's share of a split precondition;
  // the service all-gathers the rest); records the inverses used at step t.
  void precondition(int64_t t, const std::function<bool(int)>& mine = {});
  bool preconditioned() const { return preconditioned_; }
  // inline / skip with several holders: the taps go to `dist` (which accumulates the curvature
  // and posts the factor all-reduces), and inline_refresh sums and inverts through it.
  void set_distributed(DistributedKfac* dist) { dist_ = dist; }
  // The factor sums among the holders (KfacService::sum_factors): the summed row counts,
  // [2 * layer + side], the accumulators summed in place. Empty: this copy alone.
  using FactorSum = std::function<std::vector<float>()>;
  // Inline refresh at PREC: commit the step's curvature (summed by `sum`, or by the
  // DistributedKfac), invert when asked, precondition. With `times`, curvature comes from the
  // saved buffers, unit by unit, and each unit is timed.
  void inline_refresh(int64_t t, bool curvature, bool inversion, const FactorSum& sum, ChunkKfacTimes* times);
  // The units of the last inline refresh as they ran (steady-clock ns), so a measured timeline
  // shows them instead of one PREC block: CURV_A/B per layer (with `times`: all micro-batches'
  // factors from the saved buffers), SYNC_CURV (layer -1; with holders), CURV_A/B per layer again
  // (the factor's update from the step's sum), INV_A/B per layer. Cleared at each refresh.
  struct UnitStamp {
    Kind kind;
    int layer;
    int64_t start, end;
  };
  const std::vector<UnitStamp>& inline_units() const { return inline_units_; }
  void clear_inline_units() { inline_units_.clear(); }
  // Data + inversion parallelism (bubbles, W > 1 or Chimera; paper 3.2, as the planner plans
  // it): factors are committed at SYNC_CURV, which all-reduces the cycle's sums and row counts
  // among the stage's holders over `comm`; every holder switches there to the previous cycle's
  // inverses. INV writes this holder's pieces aside until then: the NCT pieces every holder
  // inverts, and the CT pieces of the holder that owns them (SPD-KFAC's Algorithm 1 in the
  // planner, over the replicas and Chimera's twins), which BCAST_INV (broadcast) sends to the
  // others just before the SYNC_CURV. MPI_COMM_NULL: back to committing at the last CURV and
  // installing inverses at INV (re-profiling); this holder's pending inverses are dropped.
  // The sums are the service's (KfacService::sync); this chunk is the one writer of its pieces.
  void set_replicated(MPI_Comm comm);
  // BCAST_INV: the piece (block -1 = whole) inverted last cycle by holder `owner` (world rank), to
  // every holder.
  void broadcast(Side s, int layer, int block, int owner);
  // SYNC_CURV after the sums (`rows` the summed row counts): the pieces set aside become the
  // inverses in use, then the cycle's factors are committed.
  void commit_synced(const std::vector<float>& rows);
  // The cycle began in a skipped step: its factors add nothing (every holder alike).
  bool poisoned() const { return poisoned_; }
  // Switch a factor to block-diagonal from step t on; its diagonal blocks now.
  void split(int layer, Side s, int blocks, int64_t t);
  int blocks(int layer, Side s) const { return pre_->layer(layer).factor(s).num_blocks(); }

  // Checkpoints (chunk_kfac_state.cpp): everything later steps read, so a resumed run continues
  // bit for bit: factors and their sums in progress, inverses in use and this replica's pending
  // ones, the cycle's saved micro-batch buffers and counters, the refresh record. Tensors are
  // named `prefix` + ...; the scalars are returned as JSON (doubles round-trip exactly).
  // load_state: `comm` as set_replicated's, applied if the saved chunk was replicated.
  nlohmann::json save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const CheckpointReader& r, const std::string& prefix, const nlohmann::json& j, MPI_Comm comm);

  // The step is skipped (a non-finite loss or gradient on some rank; every rank calls this at
  // the same step): the curvature it added is undone. inline / skip: the K-FAC state returns to
  // the step's start. bubbles: if the step began a cycle, the cycle's units that ran in it are
  // undone and its remaining CURV units do nothing (the cycle refreshes no factor; inversions
  // re-invert the factors in use). Costs a copy of the factors per curvature step / cycle, as
  // the single-process Trainer.
  void discard_step();

  const std::vector<RefreshEvent>& events() const { return record_.events(); }
  const std::vector<SplitEvent>& splits() const { return record_.splits(); }
  int layers() const { return static_cast<int>(pre_->size()); }
  // A layer's factor sizes, as the planner's costs name them (StageKfacCost's dim_a, dim_b, diag_b).
  struct LayerShape {
    int64_t dim_a = 0, dim_b = 0;
    bool diagonal_b = false;  // the MLM head's output side
  };
  LayerShape shape(int layer) const;

  // parallel.recompute: the backward re-runs the forward, and A is taken from that run only (from
  // both, every micro-batch would count twice): the executor skips the inputs of the first run.
  void skip_inputs(bool on) { skip_inputs_ = on; }

  void on_input(const Linear& l, int micro_batch, const float* x, int64_t rows, int64_t cols) override;
  void on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t cols) override;
  // Time spent in the two taps above since construction (steady-clock ns): what the copies for
  // later curvature units (or an inline refresh's curvature) add to the passes.
  int64_t tap_ns() const { return tap_ns_; }

 private:
  void take_over_cycle();
  void attach(bool on);
  using ReadTensor = std::function<void(const std::string&, const Shape&, std::span<float>)>;
  nlohmann::json save_core(const std::string& prefix, NamedTensors& out, bool buffers) const;
  void load_core(const ReadTensor& read, const std::string& what, const std::string& prefix, const nlohmann::json& j,
                 MPI_Comm comm, bool buffers);
  void take_snapshot(bool cycle);
  void distributed_refresh(int64_t t, bool curvature, bool inversion);
  void profiled_curvature(ChunkKfacTimes& times);
  void inline_commit(int64_t t, const FactorSum& sum, ChunkKfacTimes* times);
  void inline_invert(ChunkKfacTimes* times);
  void stamp(Kind k, int layer, int64_t t0);  // t0: comm::steady_now_ns

  const Config& cfg_;
  std::unique_ptr<KfacPreconditioner> pre_;
  DistributedKfac* dist_ = nullptr;
  bool overlap_;
  SavedActivations saved_;  // M_err^save (the plan's units)
  bool saving_ = false, tapping_ = false, preconditioned_ = false, skip_inputs_ = false;
  int64_t tap_ns_ = 0;
  std::vector<UnitStamp> inline_units_;
  int64_t cycle_step_ = 0;  // step whose micro-batches the saved buffers hold
  float loss_scale_ = 1.0f;
  std::pair<int64_t, float> next_cycle_{-1, 1.0f};  // a cycle starting at this step's first copy
  std::vector<std::array<int, 2>> curv_count_;          // [layer][side] CURV units this cycle
  ChunkRefreshRecord record_;
  // The service's (it owns the group's state); written here only: INV, SYNC_CURV, BCAST_INV,
  // checkpoints and a skipped step's undo all change it with the factors. On: W > 1 or Chimera bubbles.
  ReplicaSync& sync_;
  NamedTensors snapshot_;          // K-FAC state before this step's curvature (discard_step)
  std::string snapshot_scalars_;   // its JSON
  bool snapshot_cycle_ = false;    // taken at a cycle's takeover (bubbles)
  bool poisoned_ = false;          // this cycle began in a skipped step: its CURV units do nothing
};

}  // namespace pf
