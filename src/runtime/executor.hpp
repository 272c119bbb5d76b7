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
// K-FAC's kinds (CURV_A/B, SYNC_CURV, INV_A/B, BCAST_INV_A/B, PREC) go to the K-FAC handlers the
// executor is given (kfac_handlers.hpp; runtime/units/). One table (Executor::handlers) maps every
// kind to its handler; anything else, or a K-FAC kind without K-FAC, is refused with a message
// naming the kind. Which list a step runs is not the executor's business: without K-FAC the
// lowered schedule (actions()), with it what the K-FAC placement says (runtime/kfac_placement.hpp).
//
// Every MPI layout runs here, one stage included (data-parallel training, with or without
// K-FAC: the schedule is then F and B per micro-batch, the gradient all-reduce, OPT).
//
// Activation recomputation (parallel.recompute, the paper's R; pipelines only): F keeps only the
// stage's input of the micro-batch (the receive buffer, the local predecessor's output, or the
// micro-batch itself at the embedding; all kept until step end anyway) and one state serves every
// micro-batch: B / I first re-run the chunk's forward into it, then run the backward. The re-run
// is bit-identical to F (the same kernels on the same input; dropout masks are drawn from (seed,
// step, micro-batch)), so losses and weights equal the run without it. Its loss is not counted
// again; K-FAC's A is taken from it only (KfacHandlers::skip_inputs during F), and with K-FAC in the
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
#include "runtime/action_time.hpp"
#include "runtime/hosted_chunk.hpp"
#include "runtime/kfac_handlers.hpp"
#include "runtime/layout.hpp"
#include "runtime/seams.hpp"
#include "runtime/step_driver.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace pf {

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
  // K-FAC's work in the step, summed over the ranks (every rank gets it): KfacWork's counts, and
  // the seconds spent in K-FAC actions (curvature, sync, inversion, broadcast, precondition).
  int kfac_curvature = 0, kfac_inversion = 0;
  double kfac_time_s = 0;
};

class Executor {
 public:
  Executor(const Config& cfg, const Layout& layout, const comm::Groups& groups, const PoisonStep& poison);
  ~Executor();

  // The K-FAC handlers of this rank (kfac_handlers.hpp), given once after construction (they
  // attach their part to each of hosted()'s records); none: a K-FAC kind is refused.
  void set_kfac(KfacHandlers* kfac) { kfac_ = kfac; }
  // Benchmarks only: compute actions made slower by sleeping (runtime/seams.hpp's NoiseSeam).
  void set_noise(const NoiseSeam& noise) { noise_ = noise; }
  // The one record per chunk this device hosts and its lookup, in (pipeline, stage) order; a
  // checkpoint saves each one's parameters (mirrors included) and optimizer, its K-FAC state the
  // K-FAC units' (runtime/units/).
  HostedChunks& hosted() { return chunks_; }

  // One training step: runs `list` (the lowered schedule, actions(), or the K-FAC placement's
  // list of the step). `mbs` holds all W*N micro-batches of the step (filled by fill_step).
  // `times`, if given, receives each action's start and end (a floating unit's where it ran).
  // `driver` (runtime/step_driver.hpp, the placement's): the list in order, or adaptive's units
  // filling the waits. Collective over the world.
  StepOutcome run(int64_t step, const std::vector<Action>& list, const std::vector<MicroBatch>& mbs, double lr,
                  std::vector<ActionTime>* times, StepDriver& driver = in_order());
  static StepDriver& in_order();  // the list's order (no K-FAC)
  // Mean validation loss of train.eval_batches micro-batches (replica 0's pipeline 0 computes;
  // every rank gets the result). Collective.
  // Nothing when `stopped` was true on any rank before a micro-batch (asked of every rank, summed).
  std::optional<double> evaluate(Batcher& valid, const std::function<bool()>& stopped);
  // Loads every chunk's parameters (mirrors included) from a safetensors file.
  void load(const std::string& path);
  // Collective: on world rank 0, a whole model holding every stage's parameters (pipeline 0 of
  // replica 0), for saving; null elsewhere.
  std::unique_ptr<Model> gather_model();

  const std::vector<Action>& actions() const { return actions_; }  // the lowered schedule's list
  // Parameter bytes of the chunk of (pipeline, stage) on this rank, 0 if not hosted.
  int64_t stage_param_bytes(int pipeline, int stage) const;
  ActivationMemory activation_memory() const;

 private:
  // Set-up, in the constructor's order.
  void make_chunks();
  void build_chunk(HostedChunk& c);
  void make_gradient_sync(HostedChunk& c);
  void make_embedding_sync();
  void post_receives();
  void start_step(int64_t step);
  // What every handler may need of the step.
  struct StepInputs {
    const std::vector<MicroBatch>& mbs;
    double lr;
  };
  // One run of a list (executor_fill.cpp): what its driver asks of the executor (StepActions).
  struct StepRun final : StepActions {
    StepRun(Executor& e, int64_t step, const std::vector<Action>& list, StepInputs in, std::vector<ActionTime>* times,
            bool stamp_all)
        : e(e), step(step), list(list), in(in), times(times), stamp_all(stamp_all) {}
    int64_t run(size_t i) override;
    bool arrived(size_t i) override;
    void received(size_t i) override;
    void ran_in_wait(size_t u, size_t i) override;
    Executor& e;
    int64_t step;
    const std::vector<Action>& list;
    StepInputs in;
    std::vector<ActionTime>* times;
    bool stamp_all;  // the driver learns from every action's time
  };
  int64_t run_timed(const StepRun& r, size_t i);  // action i through the table, stamped; its ns
  comm::Ticket receive_ticket(const Action& a);
  using Handler = void (Executor::*)(const Action&, const StepInputs&);
  static const std::array<Handler, kNumKinds>& handlers();  // [kind], null: no handler
  void run_action(const Action& a, const StepInputs& in);
  const MicroBatch& global_micro_batch(const StepInputs& in, int m) const;
  // Handlers: the pipeline's, and K-FAC's (passed on to kfac_).
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
  void on_eigenbasis(const Action& a, const StepInputs& in);  // SOAP's EIG_L / EIG_R
  void on_statistics(const Action& a, const StepInputs& in);  // SOAP's STAT
  const Tensor& stage_input(HostedChunk& c, int m);
  void hold(int64_t bytes);
  void forward(HostedChunk& c, const MicroBatch& mb, int m);
  const Tensor& stage_output_grad(HostedChunk& c, int m);
  Tensor& stage_input_grad(HostedChunk& c, int m);
  void block_gradients_final(HostedChunk& c, size_t block, bool last);
  void backward(HostedChunk& c, const MicroBatch& mb, int m, bool last);
  void input_gradient(HostedChunk& c, const MicroBatch& mb, int m);
  void weight_gradient(HostedChunk& c, const MicroBatch& mb, int m, bool last);
  void finish_gradients(double lr);
  void sum_word_embedding();
  void gradient_norms();
  StepOutcome outcome();

  Config cfg_;
  bool recompute_ = false;  // parallel.recompute (pipelines only)
  bool split_ = false;      // I and W apart: the device's list has W actions, without recompute
  int64_t held_bytes_ = 0, peak_held_bytes_ = 0;  // ActivationMemory, now and at the peak
  const Layout& layout_;
  const comm::Groups& groups_;
  int device_;
  std::vector<Action> actions_;
  HostedChunks chunks_;  // the one record per hosted chunk (hosted_chunk.hpp)
  comm::TagScheme tags_;
  std::unique_ptr<comm::P2P> p2p_;
  // Tied word embedding: every rank holding a copy (owner or mirror) sums them.
  comm::Comm embedding_comm_;
  std::vector<Param*> word_copies_;  // this rank's copies
  std::unique_ptr<comm::BucketedAllReduce> word_sync_;
  KfacHandlers* kfac_ = nullptr;
  PoisonStep poison_;  // tests only: a step whose loss is reported NaN on purpose (runtime/seams.hpp)
  NoiseSeam noise_;    // benchmarks only: slower compute actions
  int64_t with_noise(int64_t step, size_t action, int64_t compute_ns, int64_t now);
  // Per step.
  int64_t step_ = 0;
  double loss_ = 0, grad_norm_ = 0, precond_grad_norm_ = 0;
  bool gradients_finished_ = false;
  bool step_finite_ = true;  // loss and gradient norm finite on every rank (finish_gradients)
  int64_t finish_ns_ = 0;  // time finish_gradients took in this step
  int64_t kfac_ns_ = 0;    // time in K-FAC actions
};

}  // namespace pf
