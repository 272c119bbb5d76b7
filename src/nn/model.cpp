#include "nn/model.hpp"

#include "core/error.hpp"

namespace pf {

int num_blocks(const ModelConfig& cfg) { return cfg.layers + 2; }

int64_t parameter_count(Model& m) {
  int64_t n = 0;
  for (const Param* p : m.params())
    if (!p->mirror) n += p->value.numel();
  return n;
}

Model::Model(const ModelConfig& cfg, int first_block, int last_block) : cfg_(cfg), first_(first_block), last_(last_block) {
  PF_CHECK(cfg.arch == Arch::Bert || cfg.arch == Arch::Gpt || cfg.arch == Arch::Llama, "arch {}", cfg.arch);
  PF_CHECK(0 <= first_ && first_ <= last_ && last_ < num_blocks(cfg), "block range {}..{} of {}", first_, last_,
           num_blocks(cfg));
  EmbeddingBlock* emb = nullptr;
  for (int b = first_; b <= last_; ++b) {
    if (b == 0) {
      auto e = std::make_unique<EmbeddingBlock>(cfg);
      emb = e.get();
      blocks_.push_back(std::move(e));
    } else if (b == num_blocks(cfg) - 1) {
      blocks_.push_back(std::make_unique<HeadBlock>(cfg, emb ? &emb->word() : nullptr));
    } else if (cfg.arch == Arch::Llama) {
      blocks_.push_back(std::make_unique<LlamaBlock>(cfg, b - 1));
    } else {
      blocks_.push_back(std::make_unique<TransformerBlock>(cfg, b - 1));
    }
  }
}

std::vector<Param*> Model::params() {
  std::vector<Param*> ps;
  for (auto& b : blocks_)
    for (Param* p : b->params()) ps.push_back(p);
  return ps;
}

std::vector<Linear*> Model::linears() {
  std::vector<Linear*> ls;
  for (auto& b : blocks_)
    for (Linear* l : b->linears()) ls.push_back(l);
  return ls;
}

Param* Model::find_param(const std::string& name) {
  for (Param* p : params())
    if (p->name == name) return p;
  return nullptr;
}

void Model::init(uint64_t seed) {
  for (auto& b : blocks_) b->init(seed);
  zero_grad();
}

void Model::zero_grad() {
  for (Param* p : params()) p->grad.zero();
}

void Model::set_training(bool on) {
  for (auto& b : blocks_) b->set_training(on);
}

void Model::set_dropout_step(uint64_t seed, uint64_t step) {
  for (auto& b : blocks_) b->set_dropout_step(seed, step);
}

ModelState Model::make_state(int max_rows, int seq, BackwardMode mode) const {
  PF_CHECK(max_rows > 0 && seq > 0, "state for {} x {}", max_rows, seq);
  ModelState st;
  const int64_t C = cfg_.hidden;
  for (size_t j = 0; j < blocks_.size(); ++j) {
    st.blocks.push_back(blocks_[j]->make_state(max_rows, seq, mode));
    if (j + 1 < blocks_.size()) st.acts.emplace_back(Shape{max_rows, seq, C});
  }
  st.grad_a = Tensor({max_rows, seq, C});
  st.grad_b = Tensor({max_rows, seq, C});
  return st;
}

int64_t ModelState::activation_bytes() const {
  int64_t n = 0;
  for (const auto& b : blocks) n += b->bytes();
  for (const Tensor& a : acts) n += a.numel() * static_cast<int64_t>(sizeof(float));
  return n;
}

int64_t ModelState::deferred_bytes() const {
  int64_t n = 0;
  for (const auto& b : blocks) n += b->deferred_bytes();
  return n;
}

float Model::forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, ModelState& st) {
  float loss = 0.0f;
  const Tensor* x = &x_in;
  for (size_t j = 0; j < blocks_.size(); ++j) {
    Tensor& out = j + 1 < blocks_.size() ? st.acts[j] : x_out;
    loss += blocks_[j]->forward(mb, *x, out, *st.blocks[j]);
    x = &out;
  }
  return loss;
}

// Each block's output gradients are its own (or its block's shared set, used once): every I, then
// every W, is the fused backward's arithmetic.
void Model::backward(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, ModelState& st) {
  backward_input(mb, dx_out, dx_in, st);
  backward_weight(mb, st);
}

void Model::backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, ModelState& st) {
  const Tensor* d = &dx_out;
  for (size_t j = blocks_.size(); j-- > 0;) {
    Tensor& din = block_input_grad(st, j, dx_in);
    blocks_[j]->backward_input(mb, *d, din, *st.blocks[j]);
    d = &din;
  }
}

void Model::backward_weight(const MicroBatch& mb, ModelState& st) {
  for (size_t j = blocks_.size(); j-- > 0;) blocks_[j]->backward_weight(mb, *st.blocks[j]);
}

Tensor& Model::block_input_grad(ModelState& st, size_t j, Tensor& dx_in) const {
  return j == 0 ? dx_in : ((blocks_.size() - j) % 2 ? st.grad_a : st.grad_b);
}

void Model::logits(const MicroBatch& mb, ModelState& st, int row, int position, float* out) {
  PF_CHECK(has_embedding() && has_head() && blocks_.size() >= 2, "logits need the whole model");
  PF_CHECK(0 <= row && row < mb.rows && 0 <= position && position < mb.seq, "logits at ({}, {}) of {} x {}", row,
           position, mb.rows, mb.seq);
  Tensor none;
  const Tensor* x = &none;
  for (size_t j = 0; j + 1 < blocks_.size(); ++j) {
    blocks_[j]->forward(mb, *x, st.acts[j], *st.blocks[j]);
    x = &st.acts[j];
  }
  const int64_t C = cfg_.hidden;
  const auto& head = static_cast<const HeadBlock&>(*blocks_.back());
  head.logits(x->data() + (static_cast<int64_t>(row) * mb.seq + position) * C, 1, out);
}

KvCache Model::make_kv_cache(int capacity) const {
  PF_CHECK(has_embedding() && has_head() && causal_lm(cfg_.arch), "a KV cache needs the whole causal LM");
  PF_CHECK(0 < capacity && capacity <= cfg_.max_position, "KV cache of {} tokens (max_position {})", capacity,
           cfg_.max_position);
  KvCache c;
  for (int b = 0; b < cfg_.layers; ++b) {
    c.k.emplace_back(Shape{capacity, kv_width(cfg_)});
    c.v.emplace_back(Shape{capacity, kv_width(cfg_)});
  }
  return c;
}

void Model::decode(int32_t token, KvCache& cache, float* out) {
  PF_CHECK(cache.length < cache.capacity(), "KV cache full at {} tokens", cache.length);
  std::vector<float> x(static_cast<size_t>(cfg_.hidden));
  static_cast<const EmbeddingBlock&>(*blocks_.front()).embed_one(token, cache.length, x.data());
  for (int b = 0; b < cfg_.layers; ++b)
    blocks_[static_cast<size_t>(b) + 1]->decode(x.data(), cache.length, cache.k[static_cast<size_t>(b)],
                                                cache.v[static_cast<size_t>(b)]);
  static_cast<const HeadBlock&>(*blocks_.back()).logits(x.data(), 1, out);
  ++cache.length;
}

std::unique_ptr<Model> build_model(const ModelConfig& cfg, int first_block, int last_block) {
  return std::make_unique<Model>(cfg, first_block, last_block);
}

}  // namespace pf
