#include "runtime/executor.hpp"

#include "comm/clock.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor_parts.hpp"
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace pf {


Executor::Executor(const Config& cfg, const Layout& layout, const comm::Groups& groups)
    : cfg_(cfg),
      layout_(layout),
      groups_(groups),
      device_(groups.stage),
      actions_(layout.schedule.per_device.at(groups.stage)),
      tags_(layout.chunks(), layout.micro_batches) {
  recompute_ = cfg.parallel.recompute && layout.stages() > 1;
  split_ = !recompute_ && std::any_of(actions_.begin(), actions_.end(), [](const Action& a) { return a.kind == Kind::W; });
  make_chunks();
  for (auto& c : chunks_) build_chunk(*c);
  int messages = 0;
  for (const Action& a : actions_) messages += is_p2p(a.kind);
  p2p_ = std::make_unique<comm::P2P>(groups.pipeline.get(), messages + 8);
  if (layout.grad_sync)
    for (auto& c : chunks_) make_gradient_sync(*c);
  make_embedding_sync();
  if (cfg.kfac.enabled) kfac_setup();
}

// The chunks this device hosts, in (pipeline, stage) order, with a slot per micro-batch they run.
void Executor::make_chunks() {
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (a.kind != Kind::F && a.kind != Kind::B && a.kind != Kind::I && a.kind != Kind::W) continue;
    Chunk* c = find_chunk(a.pipeline, a.stage);
    if (!c) {
      auto n = std::make_unique<Chunk>();
      n->pipeline = a.pipeline;
      n->stage = a.stage;
      n->id = layout_.chunk_id(a.pipeline, a.stage);
      n->slot.assign(layout_.micro_batches, -1);
      chunks_.push_back(std::move(n));
      std::sort(chunks_.begin(), chunks_.end(), [](auto& x, auto& y) {
        return std::pair(x->pipeline, x->stage) < std::pair(y->pipeline, y->stage);
      });
      c = find_chunk(a.pipeline, a.stage);
    }
    if (a.kind == Kind::F) c->slot.at(a.micro_batch) = c->slots++;
    if (a.kind == Kind::B || a.kind == Kind::I) c->last_backward = i, c->last_backward_mb = a.micro_batch;
    if (a.kind == Kind::W) c->last_weight_mb = a.micro_batch;
  }
}

// One chunk's model, optimizer, states and buffers, its neighbours, its copy of the word embedding.
void Executor::build_chunk(Chunk& c) {
  const ModelConfig& mc = cfg_.model;
  const int rows = cfg_.parallel.micro_batch_size;
  const Schedule& s = layout_.schedule;
  const BlockRange r = layout_.stage_blocks.at(c.stage);
  c.model = build_model(mc, r.first, r.last);
  c.model->init(cfg_.train.seed);  // each block from (seed, its names): the same bits as one process
  c.params = c.model->params();
  c.optim = make_optimizer(cfg_.optim);
  c.optim->init(c.params);
  const size_t slots = static_cast<size_t>(c.slots);
  const BackwardMode mode = split_ ? BackwardMode::split : BackwardMode::fused;
  for (size_t k = 0; k < (recompute_ ? 1 : slots); ++k) c.states.push_back(c.model->make_state(rows, mc.seq_len, mode));
  const Shape act{rows, mc.seq_len, mc.hidden};
  c.state_bytes = c.states.front().activation_bytes();
  c.deferred_bytes = c.states.front().deferred_bytes();
  c.input_bytes = c.model->has_embedding() ? 0 : shape_numel(act) * static_cast<int64_t>(sizeof(float));
  if (recompute_ && !c.model->has_head()) c.recompute_out = Tensor(act);
  if (!c.model->has_head()) c.x_out.assign(slots, Tensor(act));
  if (!c.model->has_embedding()) c.dx_in.assign(slots, Tensor(act));
  c.recv_f.resize(slots);
  c.recv_b.resize(slots);
  if (c.stage > 0) {
    const int d = s.device_of(c.pipeline, c.stage - 1);
    if (d == device_) c.prev = find_chunk(c.pipeline, c.stage - 1);
    else c.prev_device = d, c.x_in.assign(slots, Tensor(act));
    PF_CHECK(d != device_ || c.prev, "stage {} has no local predecessor chunk", c.stage);
  }
  if (c.stage + 1 < s.stages) {
    const int d = s.device_of(c.pipeline, c.stage + 1);
    if (d == device_) c.next = find_chunk(c.pipeline, c.stage + 1);
    else c.next_device = d, c.dx_out.assign(slots, Tensor(act));
    PF_CHECK(d != device_ || c.next, "stage {} has no local successor chunk", c.stage);
  }
  // Copies of the tied word embedding: the embedding's own, or the head's mirror.
  if (c.model->has_embedding())
    word_copies_.push_back(&static_cast<EmbeddingBlock&>(*c.model->blocks().front()).word());
  else if (c.model->has_head())
    word_copies_.push_back(static_cast<HeadBlock&>(*c.model->blocks().back()).mirror());
}

// Gradient all-reduce of a chunk among the stage's copies, its buffers in the order backward
// finishes them (last block first), the word embedding left to its own group.
void Executor::make_gradient_sync(Chunk& c) {
  std::vector<std::span<float>> buffers;
  const auto& blocks = c.model->blocks();
  c.ready_after_block.resize(blocks.size());
  for (size_t j = blocks.size(); j-- > 0;)
    for (Param* p : blocks[j]->params()) {
      if (std::find(word_copies_.begin(), word_copies_.end(), p) != word_copies_.end()) continue;
      c.ready_after_block[j].push_back(buffers.size());
      buffers.push_back(p->grad.span());
    }
  MPI_Comm comm = layout_.pipelines() > 1 ? groups_.holders_comm(c.stage) : groups_.data_parallel.get();
  c.grad_sync = std::make_unique<comm::BucketedAllReduce>(comm, std::move(buffers));
}

// The ranks holding a copy of the word embedding sum them (Megatron's embedding group,
// extended to every replica and Chimera's two pipelines). Collective over the world.
void Executor::make_embedding_sync() {
  MPI_Comm emb = MPI_COMM_NULL;
  comm::check(MPI_Comm_split(MPI_COMM_WORLD, word_copies_.empty() ? MPI_UNDEFINED : 0, groups_.rank, &emb),
              "MPI_Comm_split(embedding)");
  embedding_comm_ = comm::Comm(emb);
  if (!word_copies_.empty() && embedding_comm_.size() > 1)
    word_sync_ = std::make_unique<comm::BucketedAllReduce>(embedding_comm_.get(),
                                                           std::vector{word_copies_.front()->grad.span()});
}

Executor::Chunk* Executor::find_chunk(int pipeline, int stage) {
  for (auto& c : chunks_)
    if (c->pipeline == pipeline && c->stage == stage) return c.get();
  return nullptr;
}

Executor::Chunk& Executor::chunk(int pipeline, int stage) {
  Chunk* c = find_chunk(pipeline, stage);
  PF_CHECK(c, "device {} does not host stage {} of pipeline {}", device_, stage, pipeline);
  return *c;
}

int64_t Executor::stage_param_bytes(int pipeline, int stage) const {
  for (auto& c : chunks_)
    if (c->pipeline == pipeline && c->stage == stage) {
      int64_t n = 0;
      for (Param* p : c->params) n += p->mirror ? 0 : p->value.numel();
      return n * static_cast<int64_t>(sizeof(float));
    }
  return 0;
}

ActivationMemory Executor::activation_memory() const {
  ActivationMemory r;
  r.recompute = recompute_;
  r.peak_bytes = peak_held_bytes_;
  for (auto& c : chunks_) {
    r.allocated_bytes += static_cast<int64_t>(c->states.size()) * (c->state_bytes + c->deferred_bytes);
    r.stages.push_back({c->pipeline, c->stage, c->state_bytes, c->input_bytes, c->deferred_bytes});
  }
  return r;
}

void Executor::hold(int64_t bytes) {
  held_bytes_ += bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
}

void Executor::post_receives() {
  for (const Action& a : actions_) {
    if (a.kind != Kind::RECV_F && a.kind != Kind::RECV_B) continue;
    Chunk& c = chunk(a.pipeline, a.stage);
    const int k = c.slot.at(a.micro_batch);
    if (a.kind == Kind::RECV_F)
      c.recv_f[k] = p2p_->irecv(c.x_in[k].span(), c.prev_device, tags_.tag(comm::MsgKind::Activation, c.id, a.micro_batch));
    else
      c.recv_b[k] = p2p_->irecv(c.dx_out[k].span(), c.next_device,
                                tags_.tag(comm::MsgKind::ActivationGrad, c.id, a.micro_batch));
  }
}

StepOutcome Executor::step(int64_t step, const std::vector<MicroBatch>& mbs, double lr, std::vector<ActionTime>* times) {
  loss_ = 0;
  grad_norm_ = precond_grad_norm_ = 0;
  gradients_finished_ = false;
  for (auto& c : chunks_) {
    c->model->zero_grad();
    c->model->set_dropout_step(cfg_.train.seed, static_cast<uint64_t>(step));
    c->synced = false;
  }
  post_receives();
  step_ = step;
  const std::vector<Action>& list = step_actions(step);
  if (kfac_) {
    if (kfac_begin_step(step, mbs) && !times) times = &kfac_times_;  // K-FAC profiling needs the stamps
  }
  if (times) times->assign(list.size(), {});
  kfac_curv_ = kfac_inv_ = 0;
  kfac_ns_ = 0;
  const StepInputs in{mbs, lr};
  const int64_t step_t0 = comm::steady_now_ns();
  for (size_t i = 0; i < list.size(); ++i) {
    const bool kf = kfac_ && is_kfac(list[i].kind);
    const int64_t t0 = times || kf ? comm::steady_now_ns() : 0;
    finish_ns_ = 0;
    run_action(list[i], in);
    const int64_t t1 = times || kf ? comm::steady_now_ns() : 0;
    if (times) (*times)[i] = {t0, t1, finish_ns_};
    if (kf) kfac_ns_ += t1 - t0;
  }
  p2p_->wait_all();  // sends done: the next step may write their buffers
  step_ns_ = comm::steady_now_ns() - step_t0;
  if (kfac_) kfac_end_step(step, list, times ? *times : kfac_times_);
  // One reduction for the loss and the K-FAC counts.
  double sums[4] = {loss_, static_cast<double>(kfac_curv_), static_cast<double>(kfac_inv_), kfac_ns_ * 1e-9};
  comm::allreduce_sum({sums, 4}, MPI_COMM_WORLD, "the step's loss");
  StepOutcome o{sums[0], grad_norm_, precond_grad_norm_};
  o.kfac_curvature = static_cast<int>(sums[1]);
  o.kfac_inversion = static_cast<int>(sums[2]);
  o.kfac_time_s = sums[3];
  return o;
}

// The one dispatch table: every action kind to its handler (executor.hpp lists them; K-FAC's are
// in kfac_units.cpp). A kind without a handler, or out of range, is refused naming it.
const std::array<Executor::Handler, kNumKinds>& Executor::handlers() {
  static const std::array<Handler, kNumKinds> table = [] {
    std::array<Handler, kNumKinds> t{};
    auto set = [&t](Kind k, Handler h) { t[static_cast<size_t>(k)] = h; };
    set(Kind::RECV_F, &Executor::on_receive);
    set(Kind::RECV_B, &Executor::on_receive);
    set(Kind::F, &Executor::on_forward);
    set(Kind::B, &Executor::on_backward);
    set(Kind::I, &Executor::on_backward);
    set(Kind::W, &Executor::on_weight_gradient);
    set(Kind::SEND_F, &Executor::on_send);
    set(Kind::SEND_B, &Executor::on_send);
    set(Kind::ALLREDUCE, &Executor::on_allreduce);
    set(Kind::OPT, &Executor::on_optimizer);
    set(Kind::CURV_A, &Executor::on_curvature);
    set(Kind::CURV_B, &Executor::on_curvature);
    set(Kind::SYNC_CURV, &Executor::on_curvature_sync);
    set(Kind::INV_A, &Executor::on_inversion);
    set(Kind::INV_B, &Executor::on_inversion);
    set(Kind::PREC, &Executor::on_precondition);
    set(Kind::BCAST_INV_A, &Executor::on_inverse_broadcast);
    set(Kind::BCAST_INV_B, &Executor::on_inverse_broadcast);
    return t;
  }();
  return table;
}

void Executor::run_action(const Action& a, const StepInputs& in) {
  const auto k = static_cast<size_t>(a.kind);
  const Handler h = k < handlers().size() && (kfac_ || !is_kfac(a.kind)) ? handlers()[k] : nullptr;
  if (!h)
    throw UsageError(fmt::format("schedule: action {} has kind {}, which the runtime has no handler for",
                                 k < handlers().size() ? to_token(a) : "?",
                                 k < handlers().size() ? std::string(kind_name(a.kind)) : fmt::format("#{}", k)));
  (this->*h)(a, in);
}

const MicroBatch& Executor::global_micro_batch(const StepInputs& in, int m) const {
  return in.mbs.at(static_cast<size_t>(groups_.replica) * layout_.micro_batches + m);
}

void Executor::on_receive(const Action& a, const StepInputs&) {
  Chunk& c = chunk(a.pipeline, a.stage);
  const int k = c.slot[a.micro_batch];
  p2p_->wait(a.kind == Kind::RECV_F ? c.recv_f[k] : c.recv_b[k]);
}

void Executor::on_forward(const Action& a, const StepInputs& in) {
  forward(chunk(a.pipeline, a.stage), global_micro_batch(in, a.micro_batch), a.micro_batch);
}

void Executor::on_backward(const Action& a, const StepInputs& in) {
  Chunk& c = chunk(a.pipeline, a.stage);
  const MicroBatch& mb = global_micro_batch(in, a.micro_batch);
  if (a.kind == Kind::I && split_) input_gradient(c, mb, a.micro_batch);
  else backward(c, mb, a.micro_batch, a.micro_batch == c.last_backward_mb);
}

// Without a split (recomputation) the whole backward ran at I (executor.hpp).
void Executor::on_weight_gradient(const Action& a, const StepInputs& in) {
  if (!split_) return;
  Chunk& c = chunk(a.pipeline, a.stage);
  weight_gradient(c, global_micro_batch(in, a.micro_batch), a.micro_batch, a.micro_batch == c.last_weight_mb);
}

void Executor::on_send(const Action& a, const StepInputs&) {
  Chunk& c = chunk(a.pipeline, a.stage);
  const int m = a.micro_batch;
  if (a.kind == Kind::SEND_F)
    p2p_->isend(c.x_out[c.slot[m]].span(), c.next_device,
                tags_.tag(comm::MsgKind::Activation, layout_.chunk_id(a.pipeline, a.stage + 1), m));
  else
    p2p_->isend(c.dx_in[c.slot[m]].span(), c.prev_device,
                tags_.tag(comm::MsgKind::ActivationGrad, layout_.chunk_id(a.pipeline, a.stage - 1), m));
}

void Executor::on_allreduce(const Action& a, const StepInputs&) {
  Chunk& c = chunk(a.pipeline, a.stage);
  if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;
}

void Executor::on_optimizer(const Action& a, const StepInputs& in) {
  if (!gradients_finished_) finish_gradients(in.lr);
  Chunk& c = chunk(a.pipeline, a.stage);
  // A non-finite norm skips the update (optim/optimizer.hpp): so does a non-finite loss anywhere.
  c.optim->step(c.params, in.lr, step_finite_ ? precond_grad_norm_ : std::numeric_limits<double>::quiet_NaN());
}

// The chunk's input of micro-batch m: kept until step end (receive buffers and outputs are per slot).
const Tensor& Executor::stage_input(Chunk& c, int m) {
  static const Tensor none;
  const int k = c.slot.at(m);
  PF_CHECK(k >= 0, "stage {} has no slot for micro-batch {}", c.stage, m);
  return c.model->has_embedding() ? none : c.prev ? c.prev->x_out[c.prev->slot[m]] : c.x_in[k];
}

void Executor::forward(Chunk& c, const MicroBatch& mb, int m) {
  static Tensor no_output;
  const Tensor& x_in = stage_input(c, m);
  const int k = c.slot[m];
  Tensor& x_out = c.model->has_head() ? no_output : c.x_out[k];
  // With recompute this run only makes the output (and the loss): the backward runs it again.
  if (recompute_ && c.kfac) c.kfac->skip_inputs(true);
  loss_ += c.model->forward(mb, x_in, x_out, c.state(k));
  if (recompute_ && c.kfac) c.kfac->skip_inputs(false);
  hold(recompute_ ? c.input_bytes : c.state_bytes);
  if (c.model->has_head() && poison_.poisons_loss(step_)) loss_ = std::numeric_limits<double>::quiet_NaN();
}

// The gradient of micro-batch m w.r.t. the chunk's output (none at the head) and where its input
// gradient goes (nowhere at the embedding).
const Tensor& Executor::stage_output_grad(Chunk& c, int m) {
  static const Tensor none;
  const int k = c.slot.at(m);
  return c.model->has_head() ? none : c.next ? c.next->dx_in[c.next->slot[m]] : c.dx_out[k];
}

Tensor& Executor::stage_input_grad(Chunk& c, int m) {
  static Tensor no_input;
  return c.model->has_embedding() ? no_input : c.dx_in[c.slot.at(m)];
}

// After the chunk's last backward (or last W) each block's gradients go to the all-reduce as soon
// as they are final.
void Executor::block_gradients_final(Chunk& c, size_t block, bool last) {
  if (last && c.grad_sync)
    for (size_t i : c.ready_after_block[block]) c.grad_sync->ready(i);
}

// Model::backward's loop, block by block (block_gradients_final after each).
void Executor::backward(Chunk& c, const MicroBatch& mb, int m, bool last) {
  const int k = c.slot.at(m);
  if (recompute_) {  // the state again, bit for bit (its loss was counted at F)
    hold(c.state_bytes);
    static Tensor no_output;
    c.model->forward(mb, stage_input(c, m), c.model->has_head() ? no_output : c.recompute_out, c.state(k));
  }
  ModelState& st = c.state(k);
  const auto& blocks = c.model->blocks();
  const Tensor* d = &stage_output_grad(c, m);
  for (size_t j = blocks.size(); j-- > 0;) {
    Tensor& din = c.model->block_input_grad(st, j, stage_input_grad(c, m));
    blocks[j]->backward(mb, *d, din, *st.blocks[j]);
    d = &din;
    block_gradients_final(c, j, last);
  }
  hold(-(recompute_ ? c.state_bytes + c.input_bytes : c.state_bytes));
}

// I of a split backward: the input gradient; the state and the output gradients kept for W stay.
void Executor::input_gradient(Chunk& c, const MicroBatch& mb, int m) {
  c.model->backward_input(mb, stage_output_grad(c, m), stage_input_grad(c, m), c.state(c.slot.at(m)));
  hold(c.deferred_bytes);
}

// W of a split backward, block by block as Model::backward_weight (block_gradients_final after
// each); then the state is free.
void Executor::weight_gradient(Chunk& c, const MicroBatch& mb, int m, bool last) {
  ModelState& st = c.state(c.slot.at(m));
  const auto& blocks = c.model->blocks();
  for (size_t j = blocks.size(); j-- > 0;) {
    blocks[j]->backward_weight(mb, *st.blocks[j]);
    block_gradients_final(c, j, last);
  }
  hold(-(c.state_bytes + c.deferred_bytes));
}

void Executor::finish_gradients(double lr) {
  const int64_t t0 = comm::steady_now_ns();
  for (auto& c : chunks_)
    if (c->grad_sync && !c->synced) c->grad_sync->wait(), c->synced = true;
  // The norm needs every stage's preconditioned gradients.
  if (kfac_) kfac_finish_precondition(lr);
  // Tied word embedding: local copies summed into the first, summed over the group, copied back.
  if (!word_copies_.empty()) {
    std::span<float> sum = word_copies_.front()->grad.span();
    for (size_t i = 1; i < word_copies_.size(); ++i) {
      const float* g = word_copies_[i]->grad.data();
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += g[e];
    }
    if (word_sync_) word_sync_->start(), word_sync_->wait();
    for (size_t i = 1; i < word_copies_.size(); ++i) std::copy(sum.begin(), sum.end(), word_copies_[i]->grad.data());
  }
  // Global norms: every stage once (pipeline 0's chunks; mirrors are left out by grad_sq_norm),
  // as clipping sees them, and of the loss gradient (K-FAC's targets as they were before their
  // precondition). A non-finite loss (known to the last stage's ranks only) rides along, first
  // over the replicas, so that every rank skips the step here, before any optimizer step.
  double v[3] = {0, std::isfinite(loss_) ? 0.0 : 1.0, 0};
  if (groups_.data_parallel.size() > 1) comm::allreduce_sum({&v[1], 1}, groups_.data_parallel.get(), "the loss flag");
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = *chunks_[i];
    if (c.pipeline != 0) continue;
    const double sq = c.optim->grad_sq_norm(c.params);
    v[0] += sq;
    v[2] += kfac_ ? sq - c.kfac->pre().grad_sq_sum() + kfac_->raw_grad_sq[i] : sq;
  }
  comm::allreduce_sum({v, 3}, groups_.pipeline.get(), "the gradient norm");
  precond_grad_norm_ = std::sqrt(v[0]);
  grad_norm_ = std::sqrt(v[2]);
  step_finite_ = v[1] == 0 && std::isfinite(precond_grad_norm_);
  // The curvature of a skipped step must not stay in the factors.
  if (!step_finite_ && kfac_) kfac_discard_step();
  gradients_finished_ = true;
  finish_ns_ = comm::steady_now_ns() - t0;
}

double Executor::evaluate(Batcher& valid) {
  const int rows = cfg_.parallel.micro_batch_size;
  MicroBatch mb;
  mb.resize(rows, cfg_.model.seq_len);
  double loss = 0;
  static const Tensor none;
  static Tensor no_output;
  const EvalScales scale = eval_scales(valid, cfg_.train.eval_batches, rows, mb);
  for (int b = 0; b < cfg_.train.eval_batches; ++b) {
    valid.fill(static_cast<int64_t>(b) * rows, rows, mb);  // the held-out sequences Trainer::evaluate uses
    mb.index = 0;
    mb.loss_scale = scale.loss;
    mb.nsp_scale = scale.nsp;
    if (groups_.replica != 0) continue;
    // Pipeline 0's stages in order, through slot 0 of each chunk; blocking hand-offs.
    for (int st = 0; st < layout_.stages(); ++st) {
      if (layout_.schedule.device_of(0, st) != device_) continue;
      Chunk& c = chunk(0, st);
      const Tensor* x_in = &none;
      if (!c.model->has_embedding()) {
        if (c.prev) {
          x_in = &c.prev->x_out[0];
        } else {
          p2p_->wait(p2p_->irecv(c.x_in[0].span(), c.prev_device, tags_.tag(comm::MsgKind::Activation, c.id, 0)));
          x_in = &c.x_in[0];
        }
      }
      Tensor& x_out = c.model->has_head() ? no_output : c.x_out[0];
      c.model->set_training(false);
      loss += c.model->forward(mb, *x_in, x_out, c.states[0]);
      c.model->set_training(true);
      if (c.next_device >= 0)
        p2p_->wait(p2p_->isend(c.x_out[0].span(), c.next_device,
                               tags_.tag(comm::MsgKind::Activation, layout_.chunk_id(0, st + 1), 0)));
    }
  }
  comm::allreduce_sum({&loss, 1}, MPI_COMM_WORLD, "the validation loss");
  return loss;
}

void Executor::load(const std::string& path) {
  for (auto& c : chunks_) load_safetensors(path, c->params);
}

std::unique_ptr<Model> Executor::gather_model() {
  if (groups_.replica != 0) return nullptr;
  const int S = layout_.stages();
  if (device_ != 0) {
    std::vector<Param*> mine;
    for (int st = 0; st < S; ++st)
      if (layout_.schedule.device_of(0, st) == device_)
        for (Param* p : chunk(0, st).params)
          if (!p->mirror) mine.push_back(p);
    comm::P2P out(groups_.pipeline.get(), static_cast<int>(mine.size()) + 1);
    for (Param* p : mine) out.isend(p->value.span(), 0, 0);  // in stage order; MPI keeps the order per pair
    out.wait_all();
    return nullptr;
  }
  auto full = build_model(cfg_.model, 0, num_blocks(cfg_.model) - 1);
  comm::P2P in(groups_.pipeline.get(), 1);
  for (int st = 0; st < S; ++st) {
    const int d = layout_.schedule.device_of(0, st);
    if (d == 0) {
      for (Param* p : chunk(0, st).params)
        if (!p->mirror) full->find_param(p->name)->value = p->value;
      continue;
    }
    const BlockRange r = layout_.stage_blocks[st];
    auto names = build_model(cfg_.model, r.first, r.last);  // the stage's parameter list, in order
    for (Param* p : names->params())
      if (!p->mirror) in.wait(in.irecv(full->find_param(p->name)->value.span(), d, 0));
  }
  return full;
}

}  // namespace pf
