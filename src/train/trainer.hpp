#pragma once
// Single-process training: the reference every parallel layout must reproduce.
//
// A step processes the global batch: data_parallel x micro_batches micro-batches of
// micro_batch_size sequences. Step s reads sequences [s*G, (s+1)*G) of the run (G = global batch
// in sequences), micro-batch j (replica j / N, micro-batch j % N) the sequences from s*G + j*mbs,
// so a pipeline or data-parallel run sees exactly the same data. Gradients are accumulated over
// the micro-batches; the loss is the mean over all loss positions of the step.
//
// K-FAC (kfac.enabled; placement inline or skip, see kfac/preconditioner.hpp): on a curvature
// step the driver's taps accumulate A and B during the micro-batches' forwards and backwards;
// after the last backward the factors are committed, on an inversion step re-inverted, and every
// step the K-FAC layers' gradients are preconditioned (then KL-clipped if kfac.kl_clip > 0).
// The optimizer's global-norm pre-normalisation (NVLAMB) or clipping then sees the preconditioned
// gradients, as in the paper's data-parallel script (LAMB on the preconditioned gradients):
// StepStats::grad_norm is that norm. With kfac.enabled = false no tap is set and the step is
// exactly the plain one.
#include "config/config.hpp"
#include "data/batches.hpp"
#include "kfac/preconditioner.hpp"
#include "nn/model.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer.hpp"
#include "train/checkpointing.hpp"
#include "train/kfac_replay.hpp"
#include "train/soap_replay.hpp"
#include "train/test_seams.hpp"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace pf {

struct StepStats {
  int64_t step = 0;        // 0-based step just taken
  double loss = 0;         // mean token loss of the step
  double lr = 0;
  double grad_norm = 0;    // global norm of the loss gradient (before K-FAC's precondition and clipping)
  double precond_grad_norm = std::numeric_limits<double>::quiet_NaN();  // K-FAC: after its precondition,
                                                                          // what clipping sees; NaN without
  int64_t tokens = 0;      // tokens processed in the step
  double step_time_s = 0;
  // K-FAC: what this step refreshed, and the factors whose inversion needed more damping.
  bool kfac_curvature = false, kfac_inversion = false;
  int kfac_raised = 0, kfac_kept = 0;  // kfac_raised -1: not known (the MPI runtime does not gather it)
  double kfac_nu = 1;      // KL-clip factor
  // K-FAC's work: in one process, after the backward (commit, inversions, precondition, KL clip);
  // under MPI the K-FAC actions' time summed over the ranks.
  double kfac_time_s = 0;
  // The loss or the gradient norm was NaN/Inf: the step changed no weight, optimizer or K-FAC
  // state (the loop then skips on, or stops: train.on_nonfinite).
  bool nonfinite = false;
};


// The run's learning-rate schedule: optim's, with K-FAC's own warm-up (kfac.warmup_steps, -1 =
// optim.warmup_steps) when kfac.enabled. The paper shortens K-FAC's warm-up (600 vs 2000 steps).
LrSchedule make_run_lr_schedule(const Config& cfg);

// Validation loss over `batches` micro-batches of `rows` held-out sequences, sequences
// 0 .. batches*rows - 1 of `valid` (the same ones every time), without dropout: what the trainer
// logs (Trainer::evaluate), and for `pipefisher eval` also the language-model part alone. `mb`
// and `st` are scratch sized for rows x seq_len.
struct EvalResult {
  double loss = 0;          // as training reports it: mean LM loss (+ mean NSP loss with data.nsp)
  double lm_loss = 0;       // mean over the scored positions (GPT: every next token; BERT: masked ones)
  int64_t positions = 0;    // tokens scored
  int64_t sequences = 0;
  double lm_loss_se = 0;    // standard error of lm_loss over the micro-batches (batch_mean_standard_error); NaN for one
  std::vector<double> lm_shares;        // [micro-batch] its share of lm_loss (they sum to it)
  std::vector<int64_t> batch_positions; // [micro-batch] positions it scores
  bool stopped = false;                 // `stopped` said so before a forward: the rest is left out
};
// `progress` (may be empty) is called with the forwards done of all it makes (batches, or twice
// that with NSP pairs). `stopped` (may be empty) is asked before each forward: true (a stop signal
// came) ends the evaluation there, EvalResult::stopped.
using EvalProgress = std::function<void(int done, int total)>;
using StopAsked = std::function<bool()>;
EvalResult evaluate_model(Model& model, ModelState& st, Batcher& valid, int batches, int rows, MicroBatch& mb,
                          const EvalProgress& progress = {}, const StopAsked& stopped = {});

// train.eval_batches micro-batches of parallel.micro_batch_size sequences are at most what the
// held-out file `valid` holds, as eval's --batches are (more would score its sequences over again,
// without bound): UsageError naming the key. Checked before a run's first write.
void check_eval_batches(const Config& cfg, const Batcher& valid);

// The standard error of a mean over B micro-batches whose scored positions differ (n_b of N in
// all): batch b adds share[b] = n_b m_b / N to the mean m = sum(share), and the micro-batches, not
// the positions, are the independent draws (positions within a sequence are correlated), so
// Var(m) = B / (B - 1) * sum_b (share[b] - n_b m / N)^2. NaN for fewer than 2 micro-batches.
// Example: shares {1, 3} of positions {1, 1}: m = 4, means 2 and 6, SE = sqrt(2 * (1 + 1)) = 2.
double batch_mean_standard_error(std::span<const double> share, std::span<const int64_t> positions);

class Trainer {
 public:
  explicit Trainer(const Config& cfg);

  // One optimizer step over the global batch of step `step_index()`.
  StepStats step();
  // Mean validation loss over train.eval_batches micro-batches of the held-out file.
  double evaluate();
  // The same, or nothing when `stopped` said so before one of its forwards.
  std::optional<double> evaluate(const StopAsked& stopped);

  Model& model() { return *model_; }
  Optimizer& optimizer() { return *optim_; }
  KfacPreconditioner* kfac() { return kfac_.get(); }  // null unless kfac.enabled
  const KfacReplay* kfac_replay() const { return replay_.get(); }  // null unless kfac.placement = replay
  const SoapReplay* soap_replay() const { return soap_replay_.get(); }  // null unless SOAP replays
  int64_t step_index() const { return step_; }
  // Resuming from a checkpoint: the next step() runs step `s`.
  void set_step_index(int64_t s) { step_ = s; }
  // Parameters, optimizer and K-FAC, for checkpoints (train/checkpointing.hpp).
  TrainState state() { return {params_, optim_.get(), kfac_.get(), replay_.get()}; }
  int64_t tokens_per_step() const;
  // Tests only: a step made non-finite on purpose (train/test_seams.hpp).
  void set_poison(const PoisonStep& p) { poison_ = p; }

 private:
  // K-FAC's part of a step before its forwards: whether it builds curvature (taps attached).
  bool kfac_begin(int64_t step);
  // After the last backward: commit, invert, precondition, KL-clip.
  void kfac_step(StepStats& s);
  // inline / skip: commit this step's factors and invert them when the pattern says.
  void kfac_refresh(StepStats& s);
  // The step's loss or gradient was not finite: K-FAC as it was before the step.
  void kfac_abandon(const StepStats& s);

  Config cfg_;
  std::unique_ptr<Model> model_;
  ModelState state_;
  std::unique_ptr<Batcher> train_data_, valid_data_;
  std::vector<MicroBatch> mbs_;   // the step's micro-batches, sized once
  std::vector<Param*> params_;
  double param_floats_ = 0;  // in all of params_: the kernel clock's bytes (core/kernel_clock.hpp)
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<KfacPreconditioner> kfac_;
  std::unique_ptr<KfacReplay> replay_;  // kfac.placement = replay
  std::unique_ptr<SoapReplay> soap_replay_;  // kfac.placement = replay, optim.name = soap
  LrSchedule lr_;
  Tensor no_input_, no_output_;   // the whole model takes token ids and ends at the loss
  NamedTensors kfac_before_;      // K-FAC state before a curvature step, restored if it turns non-finite
  int64_t step_ = 0;
  PoisonStep poison_;
};

}  // namespace pf
