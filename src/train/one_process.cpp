#include "train/one_process.hpp"

#include "core/error.hpp"

#include <cstdio>

namespace pf {

void OneProcessEngine::build(const Config& cfg) {
  trainer_ = std::make_unique<Trainer>(cfg);
  trainer_->set_poison(poison_);
  if (const KfacReplay* r = trainer_->kfac_replay()) std::printf("%s\n", r->describe().c_str());
  if (const SoapReplay* r = trainer_->soap_replay()) std::printf("%s\n", r->describe().c_str());
}

void OneProcessEngine::load_init(const std::string& init, const CheckpointReader* ckpt) {
  load_init_weights(init, ckpt, trainer_->model().params());
}

void OneProcessEngine::load_resume(const CheckpointReader& r) {
  load_train_state(r, trainer_->state());
  trainer_->set_step_index(r.manifest().step);
}

EngineStep OneProcessEngine::step(int64_t step) {
  PF_CHECK(step == trainer_->step_index(), "step {} asked of a trainer at step {}", step, trainer_->step_index());
  return {trainer_->step(), ""};
}

std::vector<CheckpointFile> OneProcessEngine::write_checkpoint(const std::string& step_dir) {
  return write_stage_state(step_dir, 0, trainer_->state());
}

FinalRecords OneProcessEngine::finish(const std::string&) {
  FinalRecords r;
  for (Param* p : trainer_->model().params()) r.params.push_back(p);
  return r;
}

}  // namespace pf
