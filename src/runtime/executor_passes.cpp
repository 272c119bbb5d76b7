// The executor's passes over a chunk (executor.hpp): forward, backward (whole, or zero-bubble's
// I and W), the gradients' all-reduce as blocks finish, and the step's gradients finished at the
// first OPT (word embedding summed, norms).
#include "runtime/executor.hpp"

#include "comm/clock.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pf {

void Executor::hold(int64_t bytes) {
  held_bytes_ += bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
}

// The chunk's input of micro-batch m: kept until step end (receive buffers and outputs are per slot).
const Tensor& Executor::stage_input(HostedChunk& c, int m) {
  static const Tensor none;
  const int k = c.slot.at(m);
  PF_CHECK(k >= 0, "stage {} has no slot for micro-batch {}", c.stage, m);
  return c.model->has_embedding() ? none : c.prev ? c.prev->x_out[c.prev->slot[m]] : c.x_in[k];
}

void Executor::forward(HostedChunk& c, const MicroBatch& mb, int m) {
  static Tensor no_output;
  const Tensor& x_in = stage_input(c, m);
  const int k = c.slot[m];
  Tensor& x_out = c.model->has_head() ? no_output : c.x_out[k];
  // With recompute this run only makes the output (and the loss): the backward runs it again.
  if (recompute_ && kfac_) kfac_->skip_inputs(c.pipeline, c.stage, true);
  loss_ += c.model->forward(mb, x_in, x_out, c.state(k));
  if (recompute_ && kfac_) kfac_->skip_inputs(c.pipeline, c.stage, false);
  hold(recompute_ ? c.input_bytes : c.state_bytes);
  if (c.model->has_head() && poison_.poisons_loss(step_)) loss_ = std::numeric_limits<double>::quiet_NaN();
}

// The gradient of micro-batch m w.r.t. the chunk's output (none at the head) and where its input
// gradient goes (nowhere at the embedding).
const Tensor& Executor::stage_output_grad(HostedChunk& c, int m) {
  static const Tensor none;
  const int k = c.slot.at(m);
  return c.model->has_head() ? none : c.next ? c.next->dx_in[c.next->slot[m]] : c.dx_out[k];
}

Tensor& Executor::stage_input_grad(HostedChunk& c, int m) {
  static Tensor no_input;
  return c.model->has_embedding() ? no_input : c.dx_in[c.slot.at(m)];
}

// After the chunk's last backward (or last W) each block's gradients go to the all-reduce as soon
// as they are final.
void Executor::block_gradients_final(HostedChunk& c, size_t block, bool last) {
  if (last && c.grad_sync)
    for (size_t i : c.ready_after_block[block]) c.grad_sync->ready(i);
}

// Model::backward's loop, block by block (block_gradients_final after each).
void Executor::backward(HostedChunk& c, const MicroBatch& mb, int m, bool last) {
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
void Executor::input_gradient(HostedChunk& c, const MicroBatch& mb, int m) {
  c.model->backward_input(mb, stage_output_grad(c, m), stage_input_grad(c, m), c.state(c.slot.at(m)));
  hold(c.deferred_bytes);
}

// W of a split backward, block by block as Model::backward_weight (block_gradients_final after
// each); then the state is free.
void Executor::weight_gradient(HostedChunk& c, const MicroBatch& mb, int m, bool last) {
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
  for (HostedChunk& c : chunks_)
    if (c.grad_sync && !c.synced) c.grad_sync->wait(), c.synced = true;
  // The norm needs every stage's preconditioned gradients.
  if (kfac_) kfac_->before_gradient_norm(lr);
  sum_word_embedding();
  gradient_norms();
  // The curvature of a skipped step must not stay in the factors.
  if (!step_finite_ && kfac_) kfac_->discard_step();
  gradients_finished_ = true;
  finish_ns_ = comm::steady_now_ns() - t0;
}

// Tied word embedding: local copies summed into the first, summed over the group, copied back.
void Executor::sum_word_embedding() {
  if (word_copies_.empty()) return;
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
void Executor::gradient_norms() {
  double v[3] = {0, std::isfinite(loss_) ? 0.0 : 1.0, 0};
  if (groups_.data_parallel.size() > 1) comm::allreduce_sum({&v[1], 1}, groups_.data_parallel.get(), "the loss flag");
  for (HostedChunk& c : chunks_) {
    if (c.pipeline != 0) continue;
    const double sq = c.optim->grad_sq_norm(c.params);
    v[0] += sq;
    v[2] += kfac_ ? kfac_->raw_grad_sq(c.pipeline, c.stage, sq) : sq;
  }
  comm::allreduce_sum({v, 3}, groups_.pipeline.get(), "the gradient norm");
  precond_grad_norm_ = std::sqrt(v[0]);
  grad_norm_ = std::sqrt(v[2]);
  step_finite_ = v[1] == 0 && std::isfinite(precond_grad_norm_);
}

}  // namespace pf
