#pragma once
// Single-process training: the reference every parallel layout must reproduce.
//
// A step processes the global batch: data_parallel x micro_batches micro-batches of
// micro_batch_size sequences. Step s reads sequences [s*G, (s+1)*G) of the run (G = global batch
// in sequences), micro-batch j (replica j / N, micro-batch j % N) the sequences from s*G + j*mbs,
// so a pipeline or data-parallel run sees exactly the same data. Gradients are accumulated over
// the micro-batches; the loss is the mean over all loss positions of the step.
#include "config/config.hpp"
#include "data/batches.hpp"
#include "nn/model.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace pf {

struct StepStats {
  int64_t step = 0;        // 0-based step just taken
  double loss = 0;         // mean token loss of the step
  double lr = 0;
  double grad_norm = 0;    // global gradient norm before clipping
  int64_t tokens = 0;      // tokens processed in the step
  double step_time_s = 0;
};

// Fills the step's micro-batches from `batcher` and sets each one's loss_scale to 1 / (loss
// positions in the whole step). `mbs` must hold count micro-batches sized for rows x seq.
void fill_step(Batcher& batcher, int64_t step, int rows, std::vector<MicroBatch>& mbs);

class Trainer {
 public:
  explicit Trainer(const Config& cfg);

  // One optimizer step over the global batch of step `step_index()`.
  StepStats step();
  // Mean validation loss over train.eval_batches micro-batches of the held-out file.
  double evaluate();

  Model& model() { return *model_; }
  Optimizer& optimizer() { return *optim_; }
  int64_t step_index() const { return step_; }
  int64_t tokens_per_step() const;

 private:
  Config cfg_;
  std::unique_ptr<Model> model_;
  ModelState state_;
  std::unique_ptr<Batcher> train_data_, valid_data_;
  std::vector<MicroBatch> mbs_;   // the step's micro-batches, sized once
  std::vector<Param*> params_;
  std::unique_ptr<Optimizer> optim_;
  LrSchedule lr_;
  Tensor no_input_, no_output_;   // the whole model takes token ids and ends at the loss
  int64_t step_ = 0;
};

}  // namespace pf
