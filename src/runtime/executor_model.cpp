// The executor's model (executor.hpp): evaluation through pipeline 0, parameters loaded and
// gathered, checkpoint views, parameter and activation memory.
#include "runtime/executor.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace pf {

std::optional<double> Executor::evaluate(Batcher& valid, const std::function<bool()>& stopped) {
  const int rows = cfg_.parallel.micro_batch_size;
  MicroBatch mb;
  mb.resize(rows, cfg_.model.seq_len);
  double loss = 0;
  static const Tensor none;
  static Tensor no_output;
  const EvalScales scale = eval_scales(valid, cfg_.train.eval_batches, rows, mb);
  for (int b = 0; b < cfg_.train.eval_batches; ++b) {
    double stop[1] = {stopped() ? 1.0 : 0.0};  // every rank, every micro-batch: a stop ends it within one
    comm::allreduce_sum(stop, MPI_COMM_WORLD, "the stop flags");
    if (stop[0] > 0) return std::nullopt;
    valid.fill(static_cast<int64_t>(b) * rows, rows, mb);  // the held-out sequences Trainer::evaluate uses
    mb.index = 0;
    mb.loss_scale = scale.loss;
    mb.nsp_scale = scale.nsp;
    if (groups_.replica != 0) continue;
    // Pipeline 0's stages in order, through slot 0 of each chunk; blocking hand-offs.
    for (int st = 0; st < layout_.stages(); ++st) {
      if (layout_.schedule.device_of(0, st) != device_) continue;
      HostedChunk& c = chunks_.at(0, st);
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
  for (HostedChunk& c : chunks_) load_safetensors(path, c.params);
}

std::unique_ptr<Model> Executor::gather_model() {
  if (groups_.replica != 0) return nullptr;
  const int S = layout_.stages();
  if (device_ != 0) {
    std::vector<Param*> mine;
    for (int st = 0; st < S; ++st)
      if (layout_.schedule.device_of(0, st) == device_)
        for (Param* p : chunks_.at(0, st).params)
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
      for (Param* p : chunks_.at(0, st).params)
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

int64_t Executor::stage_param_bytes(int pipeline, int stage) const {
  const HostedChunk* c = chunks_.find(pipeline, stage);
  if (!c) return 0;
  int64_t n = 0;
  for (Param* p : c->params) n += p->mirror ? 0 : p->value.numel();
  return n * static_cast<int64_t>(sizeof(float));
}

ActivationMemory Executor::activation_memory() const {
  ActivationMemory r;
  r.recompute = recompute_;
  r.peak_bytes = peak_held_bytes_;
  for (HostedChunk& c : chunks_) {
    r.allocated_bytes += static_cast<int64_t>(c.states.size()) * (c.state_bytes + c.deferred_bytes);
    r.stages.push_back({c.pipeline, c.stage, c.state_bytes, c.input_bytes, c.deferred_bytes});
  }
  return r;
}

}  // namespace pf
