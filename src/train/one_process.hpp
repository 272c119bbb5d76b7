#pragma once
// The training engine of one process (train/train_engine.hpp): the whole model in a Trainer.
#include "train/test_seams.hpp"
#include "train/train_engine.hpp"
#include "train/trainer.hpp"

#include <memory>

namespace pf {

class OneProcessEngine final : public TrainEngine {
 public:
  explicit OneProcessEngine(const PoisonStep& poison = {}) : poison_(poison) {}

  std::string layout_name() const override { return "1 process"; }
  void build(const Config& cfg) override;
  void load_init(const std::string& init, const CheckpointReader* ckpt) override;
  void load_resume(const CheckpointReader& r) override;
  EngineBanner banner() const override { return {.stage_parameters = {parameter_count(trainer_->model())}}; }

  EngineStep step(int64_t step) override;
  std::optional<double> evaluate(const StopAsked& stopped) override { return trainer_->evaluate(stopped); }
  std::vector<CheckpointFile> write_checkpoint(const std::string& step_dir) override;
  FinalRecords finish(const std::string& out_dir) override;

 private:
  PoisonStep poison_;
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace pf
