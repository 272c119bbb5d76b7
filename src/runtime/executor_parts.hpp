#pragma once
// The executor's private parts, shared by its source files: executor.cpp (the pipeline: the
// schedule's actions, p2p, gradients, optimizer, the dispatch table) and the K-FAC side
// (runtime/README.md): kfac_units.cpp, kfac_step_lists.cpp, kfac_replan.cpp, kfac_reports.cpp,
// kfac_checkpoint.cpp. Not for use outside those files.
#include "comm/collectives.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "runtime/executor.hpp"
#include "runtime/chunk_kfac.hpp"
#include "sim/profile.hpp"

#include <climits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace pf {

inline constexpr int kProfileSteps = 2;  // inline, timed K-FAC steps before planning
// Safety margin of a unit in a gap (the planner's rule: duration * (1 + margin) <= gap), the
// paper's 5%. (20% measured no better on this shared 2-core machine: bench/RESULTS.md.)
inline constexpr double kPlanMargin = 0.05;

// The plan's lines on stdout (rank 0): refresh steps, splits, inline work, the precondition,
// the inversion placement; `from` names the profile (kfac_reports.cpp).
void print_plan(const KfacPlan& p, const PlanInput& in, const std::string& from);

struct Executor::Chunk {
  int pipeline = 0, stage = 0, id = 0;
  std::unique_ptr<Model> model;
  std::vector<Param*> params;
  std::unique_ptr<Optimizer> optim;
  std::vector<int> slot;               // [micro-batch] -> slot of its buffers, -1 if not run here
  int slots = 0;                       // micro-batches run here per step
  std::vector<ModelState> states;      // [slot], or one shared by all with recompute (state(k))
  Tensor recompute_out;                // the recomputed forward's output (x_out may still be in flight)
  int64_t state_bytes = 0;             // what one forward stores for its backward (ModelState)
  int64_t input_bytes = 0;             // the stage's input of one micro-batch (0 at the embedding)
  int64_t deferred_bytes = 0;          // split backward: what I keeps for W (ModelState::deferred_bytes)
  ChunkKfac* kfac = nullptr;           // this chunk's K-FAC state, if any
  std::vector<Tensor> x_out, dx_in;    // [slot] output activation / input gradient (sent, or read locally)
  std::vector<Tensor> x_in, dx_out;    // [slot] receive buffers, when the neighbour stage is on another device
  Chunk* prev = nullptr;               // neighbour stage on this device (interleaved with D = 1 etc.)
  Chunk* next = nullptr;
  int prev_device = -1, next_device = -1;  // neighbour stage on another device
  std::vector<comm::Ticket> recv_f, recv_b;  // [slot]
  size_t last_backward = SIZE_MAX;     // action index of the backward that completes the gradients
  int last_backward_mb = -1;           // its micro-batch (K-FAC steps insert actions: indices move)
  int last_weight_mb = -1;             // split backward: the micro-batch of the W that completes them
  std::vector<std::vector<size_t>> ready_after_block;  // [block] -> grad_sync buffers final after it
  std::unique_ptr<comm::BucketedAllReduce> grad_sync;
  bool synced = false;                 // grad_sync waited for in this step
  ModelState& state(int k) { return states.size() == 1 ? states[0] : states.at(k); }
};

struct Executor::KfacState {
  bool bubbles = false;
  std::vector<std::unique_ptr<ChunkKfac>> chunk;  // [chunk index]
  std::vector<comm::Comm> holders;                // [chunk] the stage's copies (own stream), or none
  std::vector<comm::Comm> inverse_comms;          // [chunk] inline / skip with copies: the broadcasts' stream
  std::vector<comm::Comm> prec_comms;             // [chunk] bubbles with copies: the precondition's all-gathers
  // [chunk] inline / skip with copies: the factor sums and inversions (kfac.distributed); after
  // `chunk` and the communicators, so it goes first (it may wait for requests on them).
  std::vector<std::unique_ptr<DistributedKfac>> dist;
  std::optional<comm::PerfModel> perf;            // kfac_perf_model: measured or read from the cache once
  std::vector<Action> inline_list;                // lowered + each chunk's PREC before the first OPT
  std::vector<int> lowered_index;                 // [inline_list index] -> actions_ index, -1 for PREC
  std::unique_ptr<KfacPlan> plan;
  PlanProfile plan_input;                         // the all-reduced profile the plan was made from
  std::optional<PlanProfile> recorded;            // kfac.plan_profile's; none = plan from timings
  double plan_scale = 1.0;                        // --test-kfac-cost-scale at planning
  std::vector<double> dur_sum;                    // [actions_ index] profiled ms
  int dur_samples = 0;
  std::vector<ChunkKfacTimes> times;              // [chunk]
  std::vector<double> raw_grad_sq;                // [chunk] its K-FAC targets' gradient before this step's
                                                  // precondition, squared (kfac_precondition)
  int drift_steps = 0;                            // consecutive steps far over the plan
  std::optional<std::pair<double, double>> bcast_model;  // W > 1: ms, ms per byte (kfac_bcast_model)
  double profiled_compute = 0;                    // this rank's F/B/I/W ms per step in the profile
  // Profiling phase: steps [profile_start, profile_start + kProfileSteps); the plan made at its
  // end runs its step 0 at plan_start.
  int64_t profile_start = 0, plan_start = kProfileSteps;
  // Re-planning (drift): every device finishes its current cycle (boundary), runs plain steps
  // (no K-FAC units but PREC) until replan_at, where all re-profile together.
  int64_t boundary = -1, replan_at = -1;
  std::vector<Action> drain_first, drain_plain, reprofile_first;
  bool profiling(int64_t t) const { return !plan || (t >= profile_start && t < profile_start + kProfileSteps); }
  bool draining(int64_t t) const { return replan_at >= 0 && t >= boundary && t < replan_at; }
};

}  // namespace pf
