#include "train/trainer.hpp"

#include "core/blas.hpp"
#include "config/placement.hpp"
#include "core/error.hpp"
#include "core/kernel_clock.hpp"
#include "kfac/cadence.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

namespace pf {

LrSchedule make_run_lr_schedule(const Config& cfg) {
  OptimConfig o = cfg.optim;
  if (cfg.kfac.enabled && cfg.kfac.warmup_steps >= 0) o.warmup_steps = cfg.kfac.warmup_steps;
  return make_lr_schedule(o, o.decay_steps > 0 ? o.decay_steps : cfg.train.steps);
}

Trainer::Trainer(const Config& given) : cfg_(given) {
  resolve_data_parallel(cfg_, 1);  // one process is a world of one
  const Config& cfg = cfg_;
  check_kfac_placement(cfg, KfacRunner::one_process);
  set_threads(cfg.train.threads);
  const auto& p = cfg_.parallel;
  train_data_ = make_batcher(cfg.model, cfg.data, false);
  valid_data_ = make_batcher(cfg.model, cfg.data, true);
  model_ = build_model(cfg.model, 0, num_blocks(cfg.model) - 1);
  model_->init(cfg.train.seed);
  state_ = model_->make_state(p.micro_batch_size, cfg.model.seq_len);
  mbs_.resize(static_cast<size_t>(p.data_parallel) * p.micro_batches);
  for (MicroBatch& mb : mbs_) mb.resize(p.micro_batch_size, cfg.model.seq_len);
  params_ = model_->params();
  for (const Param* p : params_) param_floats_ += static_cast<double>(p->value.numel());
  optim_ = make_optimizer(cfg);
  optim_->init(params_);
  lr_ = make_run_lr_schedule(cfg);
  if (cfg.kfac.enabled) kfac_ = std::make_unique<KfacPreconditioner>(model_->linears(), cfg.kfac, cfg.model.vocab);
  if (kfac_ && placement_spec(cfg.kfac).replays) replay_ = std::make_unique<KfacReplay>(cfg, *kfac_);
  if (auto* soap = dynamic_cast<Soap*>(optim_.get()); soap && placement_spec(cfg.kfac).replays)
    soap_replay_ = std::make_unique<SoapReplay>(cfg, params_, *soap);
}

int64_t Trainer::tokens_per_step() const {
  return static_cast<int64_t>(mbs_.size()) * cfg_.parallel.micro_batch_size * cfg_.model.seq_len;
}

StepStats Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  StepStats s;
  s.step = step_;
  {
    KernelScope clock(Kernel::data);
    fill_step(*train_data_, step_, cfg_.parallel.micro_batch_size, mbs_);
  }
  poison_.poison_inputs(step_, mbs_);
  {
    KernelScope clock(Kernel::zero_grads, 4.0 * param_floats_);
    model_->zero_grad();
  }
  model_->set_dropout_step(cfg_.train.seed, static_cast<uint64_t>(step_));
  s.kfac_curvature = kfac_ && kfac_begin(step_);
  for (MicroBatch& mb : mbs_) {
    s.loss += model_->forward(mb, no_input_, no_output_, state_);
    model_->backward(mb, no_output_, no_input_, state_);
  }
  if (poison_.poisons_loss(step_)) s.loss = std::numeric_limits<double>::quiet_NaN();
  s.lr = lr_.at(step_);
  // A NaN/Inf loss or gradient is caught here, before it reaches K-FAC's factors or the weights.
  {
    KernelScope clock(Kernel::optimizer, 4.0 * param_floats_);
    s.grad_norm = std::sqrt(optim_->grad_sq_norm(params_));
  }
  if (kfac_ && !(std::isfinite(s.loss) && std::isfinite(s.grad_norm))) {
    s.nonfinite = true;
    kfac_abandon(s);
    s.grad_norm = std::numeric_limits<double>::quiet_NaN();
  } else {
    double clip_norm = s.grad_norm;  // what the optimizer clips by: after K-FAC's precondition
    if (kfac_) {
      const auto tk = std::chrono::steady_clock::now();
      kfac_step(s);
      s.kfac_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tk).count();
      clip_norm = s.precond_grad_norm = std::sqrt(optim_->grad_sq_norm(params_));
    }
    s.nonfinite = !std::isfinite(s.loss) || !std::isfinite(clip_norm);
    if (soap_replay_) soap_replay_->before_update(step_);  // where the pipeline's units ran: before OPT
    // At least: the weight, its gradient and two moments read, the weight and the moments written.
    KernelScope clock(Kernel::optimizer, 7.0 * 4.0 * param_floats_);
    if (!s.nonfinite) optim_->step(params_, s.lr, clip_norm);
  }
  s.tokens = tokens_per_step();
  s.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++step_;
  return s;
}

bool Trainer::kfac_begin(int64_t step) {
  if (replay_) return replay_->begin_step(step);
  if (!refresh_cadence(cfg_.kfac).curvature_step(step)) return false;
  // With kfac.ema = 0 the factors accumulate in place: keep the previous ones in case this step's
  // curvature turns out non-finite.
  kfac_before_ = kfac_->state();
  kfac_->attach();
  return true;
}

void Trainer::kfac_abandon(const StepStats& s) {
  if (replay_) return replay_->abandon_step();
  if (!s.kfac_curvature) return;
  kfac_->detach();
  kfac_->load_state(kfac_before_);
  kfac_->finish_curvature(1.0);  // nothing pending after the restore: only clears the row counts
}

void Trainer::kfac_refresh(StepStats& s) {
  if (s.kfac_curvature) {
    kfac_->detach();
    kfac_->finish_curvature(mbs_.front().loss_scale);
  }
  s.kfac_inversion = refresh_cadence(cfg_.kfac).inversion_step(step_);
  if (!s.kfac_inversion) return;
  const InversionSummary inv = kfac_->invert_all();
  s.kfac_raised = inv.raised;
  s.kfac_kept = inv.kept;
}

void Trainer::kfac_step(StepStats& s) {
  if (replay_) {
    s.kfac_inversion = replay_->end_step(step_, mbs_.front().loss_scale) > 0;
  } else {
    kfac_refresh(s);
  }
  kfac_->precondition_all();
  s.kfac_nu = kfac_->kl_clip(s.lr);
}

double batch_mean_standard_error(std::span<const double> share, std::span<const int64_t> positions) {
  const size_t batches = share.size();
  if (batches < 2) return std::numeric_limits<double>::quiet_NaN();
  double mean = 0;
  int64_t all = 0;
  for (size_t b = 0; b < batches; ++b) {
    mean += share[b];
    all += positions[b];
  }
  double sum_sq = 0;
  for (size_t b = 0; b < batches; ++b) {
    const double d = share[b] - static_cast<double>(positions[b]) * mean / static_cast<double>(all);
    sum_sq += d * d;
  }
  return std::sqrt(static_cast<double>(batches) / static_cast<double>(batches - 1) * sum_sq);
}

void check_eval_batches(const Config& cfg, const Batcher& valid) {
  const int rows = cfg.parallel.micro_batch_size;
  const int64_t held = valid.sequences_per_epoch();
  const int64_t most = std::max<int64_t>(held / rows, 1);
  if (cfg.train.eval_batches > most)
    usage_error("train.eval_batches", "{} micro-batches of {} sequences are more than data.valid_file '{}' holds ({} "
                "sequences of {} tokens): at most {}", cfg.train.eval_batches, rows, cfg.data.valid_file, held,
                cfg.model.seq_len, most);
}

EvalResult evaluate_model(Model& model, ModelState& st, Batcher& valid, int batches, int rows, MicroBatch& mb,
                          const EvalProgress& progress, const StopAsked& stopped) {
  EvalResult r;
  const EvalScales scale = eval_scales(valid, batches, rows, mb);
  const int forwards = scale.nsp > 0 ? 2 * batches : batches;
  int done = 0;
  const Tensor none;
  Tensor no_output;
  // Each micro-batch's forward loss with these scales: its share of the mean LM loss (+ the mean
  // NSP loss); positions[b]: the positions it scores.
  std::vector<int64_t> positions(batches);
  auto pass = [&](float nsp_scale) {
    std::vector<double> share(batches);
    for (int b = 0; b < batches && !r.stopped; ++b) {
      r.stopped = stopped && stopped();
      if (r.stopped) break;
      valid.fill(static_cast<int64_t>(b) * rows, rows, mb);
      mb.index = 0;
      mb.loss_scale = scale.loss;
      mb.nsp_scale = nsp_scale;
      share[b] = model.forward(mb, none, no_output, st);
      positions[b] = mb.loss_positions();
      if (progress) progress(++done, forwards);
    }
    return share;
  };
  auto sum = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  model.set_training(false);
  std::vector<double> lm = pass(scale.nsp);
  r.loss = r.lm_loss = sum(lm);
  if (scale.nsp > 0 && !r.stopped) r.lm_loss = sum(lm = pass(0.0f));  // NSP pairs: the LM part alone, for perplexity
  model.set_training(true);
  r.positions = std::accumulate(positions.begin(), positions.end(), int64_t{0});
  r.lm_loss_se = batch_mean_standard_error(lm, positions);
  r.sequences = static_cast<int64_t>(batches) * rows;
  r.lm_shares = std::move(lm);
  r.batch_positions = std::move(positions);
  return r;
}

double Trainer::evaluate() { return *evaluate(StopAsked{}); }

std::optional<double> Trainer::evaluate(const StopAsked& stopped) {
  // Held-out sequences 0 .. eval_batches*mbs - 1: the same ones at every evaluation.
  if (kfac_) kfac_->detach();  // evaluation is no curvature (a step that threw may have left taps)
  const EvalResult r = evaluate_model(*model_, state_, *valid_data_, cfg_.train.eval_batches,
                                      cfg_.parallel.micro_batch_size, mbs_[0], {}, stopped);
  if (r.stopped) return std::nullopt;
  return r.loss;
}

}  // namespace pf
