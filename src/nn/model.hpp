#pragma once
// A model is the sequence of blocks [embedding, block_0 .. block_{L-1}, head], numbered
// 0 .. L+1; a pipeline stage builds a contiguous range of them. One ModelState per micro-batch in
// flight holds the block states and the activations between the range's blocks.
//
//   auto m = build_model(cfg, 0, num_blocks(cfg) - 1);   // the whole model
//   m->init(seed);
//   ModelState st = m->make_state(rows, seq);
//   float loss = m->forward(mb, x_in, x_out, st);       // x_in/x_out unused at the ends
//   m->backward(mb, dx_out, dx_in, st);                 // accumulates into Param::grad
// or, with a state made for it (make_state(rows, seq, BackwardMode::split)), the backward in its
// two parts, W any time after I and before the state's next forward (nn/block.hpp):
//   m->backward_input(mb, dx_out, dx_in, st);           // I
//   m->backward_weight(mb, st);                         // W
//
// Tied word embedding: if the range holds both ends, the head's decoder uses the embedding's Param;
// if it holds the head only, the head owns a mirror (Param::mirror) with the same name and initial
// values, which the runtime keeps in sync with the owner.
#include "config/config.hpp"
#include "nn/blocks.hpp"

#include <memory>
#include <vector>

namespace pf {

int num_blocks(const ModelConfig& cfg);  // layers + 2

struct ModelState {
  std::vector<std::unique_ptr<BlockState>> blocks;
  std::vector<Tensor> acts;  // acts[j]: output of the range's j-th block (all but the last)
  Tensor grad_a, grad_b;     // ping-pong gradients between blocks in backward
  // What forward stores for the backward: the blocks' states and the activations between them
  // (not grad_a / grad_b, the backward's scratch).
  int64_t activation_bytes() const;
  // What I keeps for W besides (the blocks' output gradients), with a split backward; else 0.
  int64_t deferred_bytes() const;
};

// The keys and values of the tokens a causal LM has decoded so far, per transformer block
// (Model::decode): a new token then costs one token's work, plus its attention over the cache.
struct KvCache {
  int length = 0;             // tokens in the cache (the next one's position)
  std::vector<Tensor> k, v;   // [block] (capacity, hidden)
  int capacity() const { return k.empty() ? 0 : static_cast<int>(k.front().shape()[0]); }
};

class Model {
 public:
  Model(const ModelConfig& cfg, int first_block, int last_block);

  const ModelConfig& config() const { return cfg_; }
  int first_block() const { return first_; }
  int last_block() const { return last_; }
  bool has_embedding() const { return first_ == 0; }
  bool has_head() const { return last_ == num_blocks(cfg_) - 1; }
  const std::vector<std::unique_ptr<ModelBlock>>& blocks() const { return blocks_; }

  // Every Param of the range, tied ones once (a mirror appears, flagged).
  std::vector<Param*> params();
  std::vector<Linear*> linears();
  Param* find_param(const std::string& name);

  void init(uint64_t seed);
  void zero_grad();
  // Dropout (when cfg.dropout > 0) draws from (seed, step, micro-batch index).
  void set_dropout_step(uint64_t seed, uint64_t step);
  // false for evaluation: no dropout (see ModelBlock::set_training).
  void set_training(bool on);

  ModelState make_state(int max_rows, int seq, BackwardMode mode = BackwardMode::fused) const;
  // x_in: (rows, seq, hidden) unless the range starts at the embedding; x_out: the same unless it
  // ends at the head. Returns the head's loss (0 without the head).
  float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, ModelState& st);
  // dx_out: gradient of x_out (ignored with the head); writes dx_in unless the range starts at the
  // embedding.
  void backward(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, ModelState& st);
  // The same in two parts: I (every block's, last block first) and W (likewise: the tied word
  // matrix then gets the head's part before the embedding's, as in backward).
  void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, ModelState& st);
  void backward_weight(const MicroBatch& mb, ModelState& st);
  // Inference on the whole model (embedding to head): the LM logits (vocab floats into `out`) at
  // token `position` of row `row` of mb. Runs every block but the head's loss; no backward may follow.
  void logits(const MicroBatch& mb, ModelState& st, int row, int position, float* out);
  // Inference with a KV cache (GPT, the whole model): a cache for `capacity` tokens (at most
  // model.max_position), and the next token through it, its LM logits (vocab floats) into `out`.
  // The logits equal logits() of the same tokens to float32 rounding.
  KvCache make_kv_cache(int capacity) const;
  void decode(int32_t token, KvCache& cache, float* out);
  // Where block j of the range writes its input gradient in a backward: dx_in for the first
  // block, else grad_a / grad_b in turn.
  Tensor& block_input_grad(ModelState& st, size_t j, Tensor& dx_in) const;

 private:
  ModelConfig cfg_;
  int first_, last_;
  std::vector<std::unique_ptr<ModelBlock>> blocks_;
};

// The numbers in a model's Params; a mirror is its owner's (counted on the owner's stage), so the
// stages' counts add up to the whole model's.
int64_t parameter_count(Model& m);

// Builds blocks first_block..last_block (inclusive) of the model described by cfg.
std::unique_ptr<Model> build_model(const ModelConfig& cfg, int first_block, int last_block);

}  // namespace pf
