// The executor (executor.hpp): set-up, the step, the dispatch table and its handlers. The passes
// over a chunk are in executor_passes.cpp, evaluation and the model's parameters in
// executor_model.cpp.
#include "runtime/executor.hpp"

#include "comm/clock.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <limits>

namespace pf {

Executor::Executor(const Config& cfg, const Layout& layout, const comm::Groups& groups, const PoisonStep& poison)
    : cfg_(cfg),
      layout_(layout),
      groups_(groups),
      device_(groups.stage),
      actions_(layout.schedule.per_device.at(groups.stage)),
      chunks_(groups.stage),
      tags_(layout.chunks(), layout.micro_batches),
      poison_(poison) {
  recompute_ = cfg.parallel.recompute && layout.stages() > 1;
  split_ = !recompute_ && std::any_of(actions_.begin(), actions_.end(), [](const Action& a) { return a.kind == Kind::W; });
  make_chunks();
  for (HostedChunk& c : chunks_) build_chunk(c);
  int messages = 0;
  for (const Action& a : actions_) messages += is_p2p(a.kind);
  p2p_ = std::make_unique<comm::P2P>(groups.pipeline.get(), messages + 8);
  if (layout.grad_sync)
    for (HostedChunk& c : chunks_) make_gradient_sync(c);
  make_embedding_sync();
}

Executor::~Executor() = default;

// The chunks this device hosts, in (pipeline, stage) order, with a slot per micro-batch they run.
void Executor::make_chunks() {
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (!is_pass(a.kind)) continue;
    HostedChunk* c = chunks_.find(a.pipeline, a.stage);
    if (!c) {
      c = &chunks_.add(a.pipeline, a.stage);
      c->id = layout_.chunk_id(a.pipeline, a.stage);
      c->slot.assign(layout_.micro_batches, -1);
    }
    if (a.kind == Kind::F) c->slot.at(a.micro_batch) = c->slots++, c->last_forward_mb = a.micro_batch;
    if (a.kind == Kind::B || a.kind == Kind::I) c->last_backward = i, c->last_backward_mb = a.micro_batch;
    if (a.kind == Kind::W) c->last_weight_mb = a.micro_batch;
  }
}

// One chunk's model, optimizer, states and buffers, its neighbours, its copy of the word embedding.
void Executor::build_chunk(HostedChunk& c) {
  const ModelConfig& mc = cfg_.model;
  const int rows = cfg_.parallel.micro_batch_size;
  const Schedule& s = layout_.schedule;
  const BlockRange r = layout_.stage_blocks.at(c.stage);
  c.model = build_model(mc, r.first, r.last);
  c.model->init(cfg_.train.seed);  // each block from (seed, its names): the same bits as one process
  c.params = c.model->params();
  c.optim = make_optimizer(cfg_);
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
    if (d == device_) c.prev = chunks_.find(c.pipeline, c.stage - 1);
    else c.prev_device = d, c.x_in.assign(slots, Tensor(act));
    PF_CHECK(d != device_ || c.prev, "stage {} has no local predecessor chunk", c.stage);
  }
  if (c.stage + 1 < s.stages) {
    const int d = s.device_of(c.pipeline, c.stage + 1);
    if (d == device_) c.next = chunks_.find(c.pipeline, c.stage + 1);
    else c.next_device = d, c.dx_out.assign(slots, Tensor(act));
    PF_CHECK(d != device_ || c.next, "stage {} has no local successor chunk", c.stage);
  }
  // Copies of the tied word embedding: the embedding's own, or the head's mirror (none when the
  // head has its own matrix, llama's untied lm_head).
  if (c.model->has_embedding())
    word_copies_.push_back(&static_cast<EmbeddingBlock&>(*c.model->blocks().front()).word());
  else if (c.model->has_head() && static_cast<HeadBlock&>(*c.model->blocks().back()).mirror())
    word_copies_.push_back(static_cast<HeadBlock&>(*c.model->blocks().back()).mirror());
}

// Gradient all-reduce of a chunk among the stage's copies, its buffers in the order backward
// finishes them (last block first), the word embedding left to its own group.
void Executor::make_gradient_sync(HostedChunk& c) {
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

void Executor::post_receives() {
  for (const Action& a : actions_) {
    if (a.kind != Kind::RECV_F && a.kind != Kind::RECV_B) continue;
    HostedChunk& c = chunks_.at(a.pipeline, a.stage);
    const int k = c.slot.at(a.micro_batch);
    if (a.kind == Kind::RECV_F)
      c.recv_f[k] = p2p_->irecv(c.x_in[k].span(), c.prev_device, tags_.tag(comm::MsgKind::Activation, c.id, a.micro_batch));
    else
      c.recv_b[k] = p2p_->irecv(c.dx_out[k].span(), c.next_device,
                                tags_.tag(comm::MsgKind::ActivationGrad, c.id, a.micro_batch));
  }
}

void Executor::start_step(int64_t step) {
  step_ = step;
  loss_ = 0;
  grad_norm_ = precond_grad_norm_ = 0;
  gradients_finished_ = false;
  kfac_ns_ = 0;
  for (HostedChunk& c : chunks_) {
    c.model->zero_grad();
    c.model->set_dropout_step(cfg_.train.seed, static_cast<uint64_t>(step));
    c.synced = false;
  }
  post_receives();
}

StepOutcome Executor::run(int64_t step, const std::vector<Action>& list, const std::vector<MicroBatch>& mbs, double lr,
                          std::vector<ActionTime>* times, StepDriver& driver) {
  start_step(step);
  if (times) times->assign(list.size(), {});
  StepRun r(*this, step, list, StepInputs{mbs, lr}, times, driver.stamps_all());
  driver.run(list, r);
  p2p_->wait_all();  // sends done: the next step may write their buffers
  return outcome();
}

StepDriver& Executor::in_order() {
  static InOrder driver;
  return driver;
}

// The noise's extra time, slept as part of the action (its stamp includes it, as a slower rank's would).
int64_t Executor::with_noise(int64_t step, size_t action, int64_t compute_ns, int64_t now) {
  const int64_t extra = noise_.extra_ns(groups_.rank, step, action, compute_ns);
  if (extra <= 0) return now;
  std::this_thread::sleep_for(std::chrono::nanoseconds(extra));
  return comm::steady_now_ns();
}

// One reduction for the loss and the K-FAC counts.
StepOutcome Executor::outcome() {
  const KfacWork w = kfac_ ? kfac_->work() : KfacWork{};
  double sums[4] = {loss_, static_cast<double>(w.curvature), static_cast<double>(w.inversion), kfac_ns_ * 1e-9};
  comm::allreduce_sum({sums, 4}, MPI_COMM_WORLD, "the step's loss");
  StepOutcome o{sums[0], grad_norm_, precond_grad_norm_};
  o.kfac_curvature = static_cast<int>(sums[1]);
  o.kfac_inversion = static_cast<int>(sums[2]);
  o.kfac_time_s = sums[3];
  return o;
}

// The one dispatch table: every action kind to its handler (executor.hpp lists them; K-FAC's pass
// the action on to the K-FAC handlers). A kind without a handler, or out of range, is refused naming it.
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
    set(Kind::EIG_L, &Executor::on_eigenbasis);
    set(Kind::EIG_R, &Executor::on_eigenbasis);
    set(Kind::STAT, &Executor::on_statistics);
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

comm::Ticket Executor::receive_ticket(const Action& a) {
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  const int k = c.slot[a.micro_batch];
  return a.kind == Kind::RECV_F ? c.recv_f[k] : c.recv_b[k];
}

void Executor::on_receive(const Action& a, const StepInputs&) { p2p_->wait(receive_ticket(a)); }

void Executor::on_forward(const Action& a, const StepInputs& in) {
  forward(chunks_.at(a.pipeline, a.stage), global_micro_batch(in, a.micro_batch), a.micro_batch);
}

void Executor::on_backward(const Action& a, const StepInputs& in) {
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  const MicroBatch& mb = global_micro_batch(in, a.micro_batch);
  if (a.kind == Kind::I && split_) input_gradient(c, mb, a.micro_batch);
  else backward(c, mb, a.micro_batch, a.micro_batch == c.last_backward_mb);
}

// Without a split (recomputation) the whole backward ran at I (executor.hpp).
void Executor::on_weight_gradient(const Action& a, const StepInputs& in) {
  if (!split_) return;
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  weight_gradient(c, global_micro_batch(in, a.micro_batch), a.micro_batch, a.micro_batch == c.last_weight_mb);
}

void Executor::on_send(const Action& a, const StepInputs&) {
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  const int m = a.micro_batch;
  if (a.kind == Kind::SEND_F)
    p2p_->isend(c.x_out[c.slot[m]].span(), c.next_device,
                tags_.tag(comm::MsgKind::Activation, layout_.chunk_id(a.pipeline, a.stage + 1), m));
  else
    p2p_->isend(c.dx_in[c.slot[m]].span(), c.prev_device,
                tags_.tag(comm::MsgKind::ActivationGrad, layout_.chunk_id(a.pipeline, a.stage - 1), m));
}

void Executor::on_allreduce(const Action& a, const StepInputs&) {
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;
}

void Executor::on_optimizer(const Action& a, const StepInputs& in) {
  if (!gradients_finished_) finish_gradients(in.lr);
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  // A non-finite norm skips the update (optim/optimizer.hpp): so does a non-finite loss anywhere.
  c.optim->step(c.params, in.lr, step_finite_ ? precond_grad_norm_ : std::numeric_limits<double>::quiet_NaN());
}

void Executor::on_curvature(const Action& a, const StepInputs&) { kfac_->curvature(a); }
void Executor::on_curvature_sync(const Action& a, const StepInputs&) { kfac_->curvature_sync(a); }
void Executor::on_inversion(const Action& a, const StepInputs&) { kfac_->inversion(a); }
void Executor::on_inverse_broadcast(const Action& a, const StepInputs&) { kfac_->inverse_broadcast(a); }

// SOAP's refresh of one factor's eigenbasis: the chunk's optimizer's state (optim/optimizer.hpp).
namespace {
Soap& soap_for(const Action& a, HostedChunk& c) {
  auto* soap = dynamic_cast<Soap*>(c.optim.get());
  if (!soap)
    throw UsageError(fmt::format("schedule: action {} is SOAP's work, and optim.name is {}", to_token(a), c.optim->name()));
  return *soap;
}
}  // namespace

void Executor::on_eigenbasis(const Action& a, const StepInputs&) {
  soap_for(a, chunks_.at(a.pipeline, a.stage)).refresh_factor(a.layer, side_index(a.kind));
}

// The previous step's gradient into the weight's statistics (soap_placement.hpp: one step late).
void Executor::on_statistics(const Action& a, const StepInputs&) {
  soap_for(a, chunks_.at(a.pipeline, a.stage)).update_statistics(a.layer);
}

// K-FAC preconditions the chunk's summed gradient.
void Executor::on_precondition(const Action& a, const StepInputs&) {
  HostedChunk& c = chunks_.at(a.pipeline, a.stage);
  if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;
  kfac_->precondition(a);
}

}  // namespace pf
