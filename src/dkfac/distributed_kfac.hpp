#pragma once
// Data-parallel K-FAC over the holders of one model chunk (a pipeline stage's data-parallel
// replicas and Chimera's twin; the whole model with parallel.stages = 1): the factor sums across
// holders and the placement of inversions. The executor uses it for kfac.placement = inline and
// skip wherever a stage has several holders (runtime/units/chunk_kfac.hpp: ChunkKfac forwards its taps
// here and calls finish_curvature / invert_all at PREC). kfac.distributed chooses the strategy:
//
//   d-kfac    after the backward, every factor is all-reduced (threshold-fused into messages of
//             at most 64 MB, upper triangles); every rank inverts every factor.
//   mpd-kfac  the same all-reduce; inversions round-robin over the ranks (Eq. 22), every inverse
//             broadcast from its rank (upper triangle).
//   spd-kfac  (1) pipelining (kfac.spd_pipelining): a factor's all-reduce is posted, non-blocking,
//             as soon as its last micro-batch's curvature is accumulated (A during the forward,
//             B during the backward), overlapping the following layers' compute; factors are
//             fused by the rule of fusion.hpp (A and B sequences separately) from the
//             ready times measured in the first `profile_steps` steps (which all-reduce after the
//             backward, as d-kfac). (2) load balancing (kfac.spd_balance): Algorithm 1
//             (kfac/placement.hpp) with the measured inversion and broadcast models. Either off
//             falls back to mpd-kfac's half: -Pipe-LBP is mpd-kfac.
//
// All strategies compute the same sums of the same per-replica factors and invert the same
// matrices with the same code, so they give the same weights up to the summation order MPI's
// reduction picks for a message size; only the time differs.
//
// The object gets the layers' taps (ChunkKfac forwards them on curvature steps): every Linear's
// input / output-gradient goes to KfacPreconditioner::curvature, then, on the replica's last
// micro-batch of the step, the factor is marked complete (and every factor before it in its
// sequence: a layer that saw no rows, the MLM head on a micro-batch without masks, is skipped by
// its tap) and the fused groups whose factors are all complete are posted, in sequence order on
// every rank. Non-blocking collectives
// advance only inside MPI calls, so each tap call also tests the posted requests (`progress`).
//
// Every row count travels with its factor (one float per factor, exact below 2^24), so the
// scaling of kfac_layer.hpp uses the global number of rows each layer saw.
#include "comm/perf_model.hpp"
#include "dkfac/fusion.hpp"
#include "kfac/placement.hpp"
#include "kfac/preconditioner.hpp"

#include <mpi.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pf {

struct DkfacOptions {
  KfacStrategy strategy = KfacStrategy::SpdKfac;  // d-kfac | mpd-kfac | spd-kfac
  bool pipelining = true;             // spd-kfac only
  bool balance = true;                // spd-kfac only
  int profile_steps = 2;              // curvature steps measured before the fusion plan is made
  int64_t fuse_limit = 16 << 20;      // floats per message after the backward (64 MB, Horovod's)
};
DkfacOptions dkfac_options(const KfacConfig& cfg);

// Time totals of this rank, seconds (what the benchmark reports).
struct DkfacTimes {
  int steps = 0;               // curvature steps counted (after the profile steps)
  double factor_inflight = 0;  // time with at least one factor all-reduce posted and not seen done
  double factor_wait = 0;      // time blocked waiting for factor all-reduces
  double factor_messages = 0;  // all-reduce messages
  double inversion = 0;        // inverting (this rank's share)
  double inverse_wait = 0;     // blocked waiting for inverse broadcasts
  int inversion_steps = 0;
};

class DistributedKfac final : public LinearTap {
 public:
  // factor_comm / inverse_comm: separate communicators over the replicas holding these layers
  // (their streams must not interleave with the gradient all-reduce's).
  DistributedKfac(KfacPreconditioner& kfac, MPI_Comm factor_comm, MPI_Comm inverse_comm,
                  const comm::PerfModel& model, const DkfacOptions& opt);
  ~DistributedKfac() override;
  DistributedKfac(const DistributedKfac&) = delete;
  DistributedKfac& operator=(const DistributedKfac&) = delete;

  // Extra work for every progress point (e.g. the gradient all-reduce's progress()).
  void set_progress_hook(std::function<void()> f) { hook_ = std::move(f); }

  // A curvature step: last_micro_batch is the MicroBatch::index of this replica's last one.
  void begin_step(int last_micro_batch);
  void on_input(const Linear& l, int micro_batch, const float* x, int64_t rows, int64_t cols) override;
  void on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t cols) override;
  void progress();

  // After the step's last backward: finishes the factor all-reduces and commits the global factors
  // (scaled by loss_scale and the global row counts). Collective over factor_comm. Returns the
  // factors committed (layer, side): a factor with no rows anywhere keeps its previous value.
  std::vector<std::pair<size_t, Side>> finish_curvature(double loss_scale);
  // Inverts per the placement and broadcasts the communicated inverses. Collective.
  InversionSummary invert_all();

  const InversionPlacement& placement() const { return placement_; }
  const std::vector<FusionGroup>& groups(Side s) const { return seq_[side_index(s)].groups; }
  const DkfacTimes& times() const { return times_; }
  size_t factors() const { return factors_.size(); }

  // Checkpoints: the fusion plan and the profile in progress (curvature steps seen, the factors'
  // order and summed ready times), so a resumed run posts the same messages as the one it
  // continues instead of profiling again (with 3 or more holders the message sizes may decide
  // MPI's summation order).
  nlohmann::json save_state() const;
  void load_state(const nlohmann::json& j);
  // The step since begin_step is skipped (a non-finite loss or gradient on some rank): the
  // state above returns to the step's start, so the skipped step leaves no trace in a checkpoint.
  void discard_step();

 private:
  struct Factor {
    size_t layer = 0;
    Side side = Side::A;
    int64_t dim = 0, elems = 0;  // elems: floats sent (upper triangles of the blocks, or the diagonal)
    bool diagonal = false;
  };
  struct Group {
    std::vector<int> factors;       // indices into factors_
    std::vector<float> buf;         // packed sums, then one row count per factor
    MPI_Request req = MPI_REQUEST_NULL;
    bool posted = false, done = false;
    double t_post = 0, t_done = 0;
  };
  struct Sequence {
    std::vector<int> order;              // factor indices in compute order
    std::vector<int> pos;                // [factor] -> position in order (-1 if not of this side)
    std::vector<FusionGroup> groups;     // the plan
    std::vector<double> ready_sum;       // [position] measured ready times summed over profile steps
    int complete = -1;                   // highest position complete in this step
    size_t next_group = 0;               // groups posted so far in this step
  };

  int factor_index(size_t layer, Side s) const { return static_cast<int>(2 * layer + side_index(s)); }
  void tap(const Linear& l, Side s, int micro_batch, const float* x, int64_t rows);
  void make_plan();
  void profile_readiness();  // finish_curvature in a profile step (pipelining)
  void install_received(const std::vector<int>& received);  // invert_all's broadcast inverses
  void rebuild_groups();  // groups_ (message buffers) from seq_'s plans
  void post_ready(Sequence& q, int seq_index);
  void post(Group& g);
  void pack(const Factor& f, float* out) const;
  void unpack_sum(const Factor& f, const float* in);
  void test_groups();

  KfacPreconditioner& kfac_;
  MPI_Comm factor_comm_, inverse_comm_;
  comm::PerfModel model_;
  DkfacOptions opt_;
  int rank_ = 0, size_ = 1;
  bool use_pipelining_ = false, use_balance_ = false;
  std::vector<Factor> factors_;
  InversionPlacement placement_;
  std::vector<float> bcast_buf_;
  std::vector<size_t> bcast_offset_;  // [factor] offset of its inverse in bcast_buf_ (CTs)

  // Per step.
  Sequence seq_[2];                   // A, B
  std::vector<Group> groups_[2];      // posted messages of the current plan, per side
  std::vector<Group> flat_;           // the after-backward messages (profile steps, no pipelining)
  bool pipelined_now_ = false;
  int last_mb_ = -1;
  int curvature_steps_ = 0;
  std::vector<double> ready_now_;     // [factor] time its last micro-batch's curvature finished
  std::vector<int> first_seen_[2];    // profile: factors in the order their taps first fired
  std::function<void()> hook_;
  DkfacTimes times_;
  std::string snapshot_;              // save_state() at begin_step (discard_step)
};

}  // namespace pf
