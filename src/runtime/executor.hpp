#pragma once
// The executor: one per rank. It holds the model chunks of the stages its device hosts and runs
// the device's action list of the lowered schedule (layout.hpp) once per training step, mapping
// each action kind to a handler:
//   RECV_F / RECV_B  wait for the activation / output gradient (every receive of the step is
//                    posted at step start into per-(chunk, micro-batch) buffers made once)
//   F                forward of one micro-batch through the chunk
//   SEND_F / SEND_B  start the non-blocking send of the output / input gradient (completed at
//                    step end, before any buffer is written again)
//   B                full backward (input and weight gradients)
//   I, W             zero-bubble's split backward (nn/block.hpp): I the input gradient (sent to
//                    the previous stage), W the weight gradients, where the schedule puts it; the
//                    state and the output gradients I keeps stay held until W. With recomputation
//                    (one state shared by every micro-batch) I runs the full backward and W nothing.
//   ALLREDUCE        wait for the chunk's gradient all-reduce among its copies (data-parallel
//                    replicas and Chimera's twin), which the chunk's last backward started block by
//                    block, bucketed, so it overlaps the remaining backward work on the device
//   OPT              the first OPT of a step finishes the gradients (all-reduces, the tied word
//                    embedding summed over every rank holding a copy, the global gradient norm
//                    over the pipeline); every OPT steps its chunk's optimizer
// K-FAC's kinds (CURV_A/B, SYNC_CURV, INV_A/B, BCAST_INV_A/B, PREC) are PipeFisher's, handled in
// kfac_units.cpp. One table (Executor::handlers) maps every kind to its handler; anything else,
// or a K-FAC kind without K-FAC, is refused with a message naming the kind.
//
// Every MPI layout runs here, one stage included (data-parallel training, with or without
// K-FAC: the schedule is then F and B per micro-batch, the gradient all-reduce, OPT). With
// kfac.placement = inline or skip, a stage with several copies sums its factors and places its
// inversions through a DistributedKfac (dkfac/distributed_kfac.hpp) as kfac.distributed,
// kfac.spd_pipelining and kfac.spd_balance say; kfac.kl_clip scales by v.g summed over the stages.
//
// Activation recomputation (parallel.recompute, the paper's R; pipelines only): F keeps only the
// stage's input of the micro-batch (the receive buffer, the local predecessor's output, or the
// micro-batch itself at the embedding; all kept until step end anyway) and one state serves every
// micro-batch: B / I first re-run the chunk's forward into it, then run the backward. The re-run
// is bit-identical to F (the same kernels on the same input; dropout masks are drawn from (seed,
// step, micro-batch)), so losses and weights equal the run without it. Its loss is not counted
// again; K-FAC's A is taken from it only (ChunkKfac::skip_inputs during F), and with K-FAC in the
// bubbles the planner makes CURV_A wait for the backward (PlanInput::recompute).
//
// Micro-batches: replica w runs global micro-batches w*N .. w*N+N-1 of the step (MicroBatch
// index j = w*N + m, the single-process trainer's numbering), so losses and gradients are those
// of single-process training of the same global batch, up to summation order.
#include "comm/collectives.hpp"
#include "comm/p2p.hpp"
#include "comm/perf_model.hpp"
#include "comm/world.hpp"
#include "config/config.hpp"
#include "data/batches.hpp"
#include "nn/model.hpp"
#include "optim/optimizer.hpp"
#include "runtime/layout.hpp"
#include "train/checkpointing.hpp"
#include "train/test_seams.hpp"

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

namespace pf {

struct PlanProfile;  // sim/profile.hpp

// Start and end (steady clock, ns) of each action of the device's list in one step.
// `wait` is the part spent waiting for other ranks inside a compute handler (the first OPT of a
// step finishing the gradients: all-reduces, embedding sum, norm), drawn as idle time.
struct ActionTime {
  int64_t start = 0, end = 0, wait = 0;
};

// Activation memory of this rank's device: what forwards keep for backwards. Without recompute a
// forward keeps its whole ModelState (every block's activations) until the micro-batch's backward;
// with it, the stage's input only, plus one state while a backward re-runs the forward.
// With a split backward (zero-bubble's I and W) a forward's state is held until its W, and the
// output gradients W reads (deferred_bytes) from its I until its W.
struct ActivationMemory {
  bool recompute = false;
  int64_t peak_bytes = 0;       // the most held at once, over the run so far
  int64_t allocated_bytes = 0;  // the states made at set-up (per micro-batch slot; one per chunk with recompute)
  struct Stage {
    int pipeline = 0, stage = 0;
    int64_t state_bytes = 0, input_bytes = 0, deferred_bytes = 0;
  };
  std::vector<Stage> stages;    // the chunks hosted here
};

struct StepOutcome {
  double loss = 0;       // mean token loss of the global batch (every rank gets it)
  double grad_norm = 0;          // global norm of the loss gradient (before K-FAC and clipping)
  double precond_grad_norm = 0;  // after K-FAC's precondition (what clipping sees); grad_norm without K-FAC
  // K-FAC's work in the step, summed over the ranks (every rank gets it): factor pieces whose
  // curvature / inversion ran (placed units, or an inline refresh's layers), and the seconds
  // spent in K-FAC actions (curvature, sync, inversion, broadcast, precondition).
  int kfac_curvature = 0, kfac_inversion = 0;
  double kfac_time_s = 0;
};

class Executor {
 public:
  Executor(const Config& cfg, const Layout& layout, const comm::Groups& groups);
  ~Executor();

  // One training step. `mbs` holds all W*N micro-batches of the step (filled by fill_step).
  // `times`, if given, receives each action's start and end. Collective over the world.
  StepOutcome step(int64_t step, const std::vector<MicroBatch>& mbs, double lr, std::vector<ActionTime>* times);
  // Mean validation loss of train.eval_batches micro-batches (replica 0's pipeline 0 computes;
  // every rank gets the result). Collective.
  double evaluate(Batcher& valid);
  // Loads every chunk's parameters (mirrors included) from a safetensors file.
  void load(const std::string& path);
  // Collective: on world rank 0, a whole model holding every stage's parameters (pipeline 0 of
  // replica 0), for saving; null elsewhere.
  std::unique_ptr<Model> gather_model();
  // Checkpoints (train/checkpointing.hpp): each hosted chunk's parameters and optimizer, in
  // (pipeline, stage) order.
  struct ChunkState {
    int pipeline = 0, stage = 0;
    TrainState state;
  };
  std::vector<ChunkState> chunk_states();

  const std::vector<Action>& actions() const { return actions_; }
  // The action list of step `step` (the lowered schedule, or with K-FAC: kfac_step_lists.cpp).
  const std::vector<Action>& step_actions(int64_t step) const;
  // Checkpoints: this rank's K-FAC state (every hosted chunk's ChunkKfac, the PipeFisher plan's
  // inputs and position, the profile in progress) as `kfac-rank-R.safetensors` in step_dir; the
  // file written, or nothing without K-FAC. load_kfac_state restores it (same layout only: the
  // caller checks) and remakes the plan from the saved profile, never from new timings.
  std::vector<CheckpointFile> write_kfac_state(const std::string& step_dir) const;
  void load_kfac_state(const CheckpointReader& r);
  // The PipeFisher profile the plan in use was made from (runtime/plan_record.hpp: its record is
  // out_dir/kfac_profile.json); null before planning or without bubbles.
  const PlanProfile* plan_profile() const;
  // For the profiler: the step's list and stamps with each PREC that ran an inline refresh
  // replaced by the refresh's units as they ran (curvature, curvature sync, inversions per
  // layer), then the PREC itself from the last unit's end. No-op without K-FAC.
  void expand_inline_units(std::vector<Action>& actions, std::vector<ActionTime>& times) const;
  // This rank's K-FAC layers: (pipeline, stage, layer within the stage, the layer's name).
  std::vector<std::tuple<int, int, int, std::string>> kfac_layer_names() const;
  // Collective: rank 0 writes the K-FAC refresh record (chunk_kfac.hpp) to `path`; no-op without K-FAC.
  void write_kfac_record(const std::string& path);
  // With a DistributedKfac per stage (inline / skip, several copies per stage): one line for the
  // start of the run (strategy, factors, inverses broadcast, perf model measured or cached), on
  // world rank 0 (its stage); "" otherwise.
  std::string kfac_distributed_line() const;
  // Collective, no-op without DistributedKfacs: rank 0 writes `path` (dkfac.json): the strategy,
  // per stage the fusion and the inversion placement, and the K-FAC time totals averaged over
  // ranks (factor all-reduces in flight and waited for, inversions, broadcast waits) with the
  // mean step time of the steps given (step_time_sum over timed_steps, per rank).
  void write_dkfac_record(const std::string& path, double step_time_sum, int timed_steps);
  // Parameter bytes of the chunk of (pipeline, stage) on this rank, 0 if not hosted.
  int64_t stage_param_bytes(int pipeline, int stage) const;
  ActivationMemory activation_memory() const;
  // Tests only: a step whose loss is reported NaN on purpose (train/test_seams.hpp, kind loss).
  void set_poison(const PoisonStep& p) { poison_ = p; }
  // Tests only: K-FAC's planning fixed (train/test_seams.hpp).
  void set_kfac_seams(const KfacSeams& k) { kfac_seams_ = k; }

 private:
  struct Chunk;
  Chunk& chunk(int pipeline, int stage);
  Chunk* find_chunk(int pipeline, int stage);
  // Set-up, in the constructor's order.
  void make_chunks();
  void build_chunk(Chunk& c);
  void make_gradient_sync(Chunk& c);
  void make_embedding_sync();
  void post_receives();
  // What every handler may need of the step.
  struct StepInputs {
    const std::vector<MicroBatch>& mbs;
    double lr;
  };
  using Handler = void (Executor::*)(const Action&, const StepInputs&);
  static const std::array<Handler, kNumKinds>& handlers();  // [kind], null: no handler
  void run_action(const Action& a, const StepInputs& in);
  const MicroBatch& global_micro_batch(const StepInputs& in, int m) const;
  // Handlers: the pipeline's (executor.cpp), K-FAC's units (kfac_units.cpp).
  void on_receive(const Action& a, const StepInputs& in);
  void on_forward(const Action& a, const StepInputs& in);
  void on_backward(const Action& a, const StepInputs& in);
  void on_weight_gradient(const Action& a, const StepInputs& in);
  void on_send(const Action& a, const StepInputs& in);
  void on_allreduce(const Action& a, const StepInputs& in);
  void on_optimizer(const Action& a, const StepInputs& in);
  void on_curvature(const Action& a, const StepInputs& in);
  void on_curvature_sync(const Action& a, const StepInputs& in);
  void on_inversion(const Action& a, const StepInputs& in);
  void on_precondition(const Action& a, const StepInputs& in);
  void on_inverse_broadcast(const Action& a, const StepInputs& in);
  const Tensor& stage_input(Chunk& c, int m);
  void hold(int64_t bytes);
  void forward(Chunk& c, const MicroBatch& mb, int m);
  const Tensor& stage_output_grad(Chunk& c, int m);
  Tensor& stage_input_grad(Chunk& c, int m);
  void block_gradients_final(Chunk& c, size_t block, bool last);
  void backward(Chunk& c, const MicroBatch& mb, int m, bool last);
  void input_gradient(Chunk& c, const MicroBatch& mb, int m);
  void weight_gradient(Chunk& c, const MicroBatch& mb, int m, bool last);
  void finish_gradients(double lr);
  // K-FAC (runtime/README.md: kfac_units, kfac_step_lists, kfac_replan, kfac_reports, kfac_checkpoint).
  struct KfacState;
  void kfac_setup();
  bool kfac_begin_step(int64_t step, const std::vector<MicroBatch>& mbs);  // true: a profiling step
  size_t kfac_chunk_index(const Action& a) const;  // the hosted chunk a K-FAC action names
  void kfac_end_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  void kfac_plan();
  std::pair<double, double> kfac_bcast_model();
  void kfac_make_plan(bool restoring);
  void kfac_split_as_planned();
  void kfac_drain_lists();
  void kfac_discard_step();
  void kfac_drift(int64_t step, double compute_ms);
  void kfac_precondition(Chunk& c, size_t index);
  const comm::PerfModel& kfac_perf_model();
  void kfac_setup_distributed();
  void kfac_kl_clip(double lr);
  void kfac_finish_precondition(double lr);
  void kfac_split_preconditions();

  Config cfg_;
  bool recompute_ = false;  // parallel.recompute (pipelines only)
  bool split_ = false;      // I and W apart: the device's list has W actions, without recompute
  int64_t held_bytes_ = 0, peak_held_bytes_ = 0;  // ActivationMemory, now and at the peak
  const Layout& layout_;
  const comm::Groups& groups_;
  int device_;
  std::vector<Action> actions_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  comm::TagScheme tags_;
  std::unique_ptr<comm::P2P> p2p_;
  // Tied word embedding: every rank holding a copy (owner or mirror) sums them.
  comm::Comm embedding_comm_;
  std::vector<Param*> word_copies_;  // this rank's copies
  std::unique_ptr<comm::BucketedAllReduce> word_sync_;
  // Per step.
  double loss_ = 0, grad_norm_ = 0, precond_grad_norm_ = 0;
  bool gradients_finished_ = false;
  bool step_finite_ = true;  // loss and gradient norm finite on every rank (finish_gradients)
  int64_t finish_ns_ = 0;  // time finish_gradients took in this step
  int kfac_curv_ = 0, kfac_inv_ = 0;  // this step's K-FAC work on this rank (StepOutcome)
  int64_t kfac_ns_ = 0;
  std::unique_ptr<KfacState> kfac_;  // null unless kfac.enabled
  int64_t step_ = 0;
  PoisonStep poison_;
  KfacSeams kfac_seams_;
  int64_t step_ns_ = 0;  // duration of the last step's action list
  std::vector<ActionTime> kfac_times_;  // K-FAC profiling steps
};

}  // namespace pf
