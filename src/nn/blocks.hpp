#pragma once
// The kinds of block a model is made of: EmbeddingBlock, TransformerBlock (post-LN for arch =
// bert, pre-LN for arch = gpt) or LlamaBlock (arch = llama), and HeadBlock (BERT masked-LM or a
// causal-LM head). Parameter names are Hugging Face's (BertForPreTraining, GPT2LMHeadModel,
// LlamaForCausalLM).
//
// Memory: a BlockState holds one micro-batch's activations (what its backward needs), made once by
// make_state. Backward's temporaries live in the block and are shared by all its states (a block
// runs one backward at a time); make_state sizes them too. forward/backward allocate nothing.
// The output gradients I keeps for W (nn/block.hpp) are the state's own when it is made for a
// split backward, else one set in the block, shared like the temporaries.
// A block copies its input into its state, so the caller may reuse x_in after forward.
//
// Attention masks: BERT uses MicroBatch::attn_mask (padding keys get probability 0); GPT is causal
// and ignores attn_mask (its batches are unpadded windows). Dropout (cfg.dropout > 0) applies to
// the embedding output and to both residual branches; attention probabilities are not dropped.
#include "config/config.hpp"
#include "core/kernels.hpp"
#include "nn/block.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"

#include <memory>
#include <string>
#include <vector>

namespace pf {

struct EmbeddingGrads;    // blocks.cpp
struct TransformerGrads;  // transformer_block.cpp
struct HeadGrads;         // blocks.cpp

// What Model needs from its blocks beyond the Block interface.
class ModelBlock : public Block {
 public:
  // Initialises every parameter from (seed, its name) only: independent of how the model is cut.
  virtual void init(uint64_t seed) = 0;
  // Inference (a causal LM's transformer blocks): x (hidden floats), the token at `position`,
  // through the block in place; its key and value join rows `position` of k and v (rows of
  // kv_width(cfg) floats, at least position + 1 of them).
  virtual void decode(float* x, int position, Tensor& k, Tensor& v) const;
  // Dropout masks are drawn from (seed, site, step, micro-batch index).
  void set_dropout_step(uint64_t seed, uint64_t step) {
    dropout_seed_ = seed;
    dropout_step_ = step;
  }
  // Dropout applies only while training; evaluation forwards run without it (and are not
  // followed by a backward).
  void set_training(bool on) { training_ = on; }

 protected:
  CounterRng dropout_rng(uint64_t site_key, int micro_batch) const {
    return {stream_key(stream_key(site_key, dropout_seed_), (dropout_step_ << 16) + static_cast<uint64_t>(micro_batch))};
  }
  uint64_t dropout_seed_ = 0, dropout_step_ = 0;
  bool training_ = true;
};

// Fills a parameter: N(0, std) drawn from stream_key(seed, name), in parallel and the same bits
// for any thread count.
void init_normal(Param& p, uint64_t seed, float std);

class EmbeddingBlock : public ModelBlock {
 public:
  explicit EmbeddingBlock(const ModelConfig& cfg);
  std::string name() const override { return "embedding"; }
  std::vector<Param*> params() override;
  std::unique_ptr<BlockState> make_state(int max_rows, int seq, BackwardMode mode) const override;
  float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) override;
  void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) override;
  void backward_weight(const MicroBatch& mb, BlockState& st) override;
  void init(uint64_t seed) override;
  Param& word() { return wte_; }
  // Inference (GPT): one token's embedding at `position` (C floats), as forward computes it.
  void embed_one(int32_t token, int position, float* out) const;

 private:
  ModelConfig cfg_;
  bool bert_, llama_;
  Param wte_, wpe_, wtt_;   // wtt_ only for bert; wpe_ not for llama (rotary positions)
  std::unique_ptr<LayerNorm> ln_;  // bert only
  uint64_t drop_key_;
  mutable Tensor d_a_;
  mutable std::shared_ptr<EmbeddingGrads> shared_grads_;
};

class TransformerBlock : public ModelBlock {
 public:
  TransformerBlock(const ModelConfig& cfg, int layer);
  std::string name() const override { return name_; }
  std::vector<Param*> params() override;
  std::vector<Linear*> linears() override;
  std::unique_ptr<BlockState> make_state(int max_rows, int seq, BackwardMode mode) const override;
  float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) override;
  void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) override;
  void backward_weight(const MicroBatch& mb, BlockState& st) override;
  void init(uint64_t seed) override;
  // Inference (GPT): x (C floats), the token at `position`, through the block in place; its key
  // and value join the cache's rows `position` (k and v hold at least position + 1 rows of C).
  void decode(float* x, int position, Tensor& k, Tensor& v) const override;

 private:
  float forward_bert(const MicroBatch& mb, float* out, BlockState& st);
  float forward_gpt(const MicroBatch& mb, float* out, BlockState& st);
  void backward_input_bert(const MicroBatch& mb, const float* dout, float* dx, BlockState& st);
  void backward_input_gpt(const MicroBatch& mb, const float* dout, float* dx, BlockState& st);

  ModelConfig cfg_;
  int layer_;
  bool bert_;
  Gelu gelu_;
  std::string name_;
  // The Linears by their role, one set per architecture (the other stays empty); in_order()
  // lists them in Hugging Face's order (block_linear_names).
  struct BertLinears {
    std::unique_ptr<Linear> query, key, value, attn_out, intermediate, output;
  } bert_lin_;
  struct GptLinears {
    std::unique_ptr<Linear> c_attn, attn_proj, c_fc, mlp_proj;  // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  } gpt_lin_;
  std::vector<Linear*> in_order() const;
  std::unique_ptr<LayerNorm> ln1_, ln2_;  // bert: attention.output.LayerNorm, output.LayerNorm; gpt: ln_1, ln_2
  uint64_t drop_attn_key_, drop_mlp_key_;
  // Backward temporaries shared by all states (sized by make_state).
  mutable Tensor d_a_, d_b_, d_c_, attn_scratch_;
  mutable std::shared_ptr<TransformerGrads> shared_grads_;
};

struct LlamaGrads;  // llama_block.cpp

// A Llama-style decoder layer (Touvron et al. 2023; Hugging Face's LlamaDecoderLayer), pre-norm:
//   r1 = x + Attn(rope(RMS1(x) Wq), rope(RMS1(x) Wk), RMS1(x) Wv) Wo;  out = r1 + (silu(h2 Wg) * h2 Wu) Wd, h2 = RMS2(r1)
// No biases; model.kv_heads key/value heads shared by groups of query heads (grouped-query
// attention); causal. Dropout applies to both residual branches, as in TransformerBlock.
class LlamaBlock : public ModelBlock {
 public:
  LlamaBlock(const ModelConfig& cfg, int layer);
  std::string name() const override { return name_; }
  std::vector<Param*> params() override;
  std::vector<Linear*> linears() override;
  std::unique_ptr<BlockState> make_state(int max_rows, int seq, BackwardMode mode) const override;
  float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) override;
  void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) override;
  void backward_weight(const MicroBatch& mb, BlockState& st) override;
  void init(uint64_t seed) override;
  void decode(float* x, int position, Tensor& k, Tensor& v) const override;

 private:
  void attention_backward_to_qkv(const MicroBatch& mb, const float* da, BlockState& st, LlamaGrads& g);
  ModelConfig cfg_;
  std::string name_;
  int64_t D_, KVH_, KV_;  // head size, key/value heads, their width (KVH_ x D_)
  // self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj: in_order() is Hugging Face's order.
  std::unique_ptr<Linear> q_, k_, v_, o_, gate_, up_, down_;
  std::vector<Linear*> in_order() const;
  std::unique_ptr<RmsNorm> norm1_, norm2_;  // input_layernorm, post_attention_layernorm
  Rope rope_;
  uint64_t drop_attn_key_, drop_mlp_key_;
  // Backward temporaries shared by all states (sized by make_state).
  mutable Tensor d_a_, d_b_, d_k_, d_v_, d_f_, attn_scratch_;
  mutable std::shared_ptr<LlamaGrads> shared_grads_;
};

struct HeadState;  // blocks.cpp

class HeadBlock : public ModelBlock {
 public:
  // `tied_word`: the embedding's word matrix when it is in the same model, else null (the head
  // then owns a mirror Param of the same name and initial value).
  HeadBlock(const ModelConfig& cfg, Param* tied_word);
  std::string name() const override { return "head"; }
  std::vector<Param*> params() override;
  std::vector<Linear*> linears() override;
  std::unique_ptr<BlockState> make_state(int max_rows, int seq, BackwardMode mode) const override;
  float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) override;
  void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) override;
  void backward_weight(const MicroBatch& mb, BlockState& st) override;
  void init(uint64_t seed) override;
  Param* mirror() { return mirror_.get(); }
  // Inference: the LM logits (rows, vocab) of hidden rows x (rows, hidden), without loss or
  // saved state (forward() turns its logits into probabilities for the backward).
  void logits(const float* x, int64_t rows, float* out) const;
  // How many labelled rows' logits exist at once (decoder_pass; model.logit_chunk_rows): tests
  // set fewer to cut a micro-batch into several chunks. Set it before make_state.
  void set_logit_chunk_rows(int64_t rows) { chunk_rows_ = rows; }
  int64_t logit_chunk_rows() const { return chunk_rows_; }

 private:
  void decoder_pass(const MicroBatch& mb, HeadState& st) const;
  double nsp_forward(const MicroBatch& mb, const Tensor& x_in, HeadState& st);
  void nsp_backward_input(const MicroBatch& mb, Tensor& dx_in, HeadState& st);
  // The norm before the decoder, one of ln_ and rms_: rows x (rows, C) -> h, keeping mean (not
  // for RMSNorm) and rstd; and its backward into dx.
  void norm_forward(float* h, float* mean, float* rstd, const float* x, int64_t rows) const;
  void norm_backward(float* dx, const float* dh, const float* x, const float* mean, const float* rstd, int64_t rows);
  ModelConfig cfg_;
  bool bert_;
  std::unique_ptr<Param> mirror_;
  std::unique_ptr<Linear> transform_;    // bert: cls.predictions.transform.dense
  std::unique_ptr<LayerNorm> ln_;        // bert: transform.LayerNorm; gpt: transformer.ln_f
  std::unique_ptr<RmsNorm> rms_;         // llama: model.norm
  // Tied to the word embedding (+ cls.predictions.bias for bert), or llama's own lm_head.weight
  // (model.tie_embeddings = false).
  std::unique_ptr<Linear> decoder_;
  // bert: bert.pooler.dense and cls.seq_relationship (BertForPreTraining's NSP head), trained with
  // model.nsp (data.nsp); always present, so saved weights are BertForPreTraining's.
  std::unique_ptr<Linear> pooler_, nsp_;
  mutable Tensor d_a_, d_b_;
  mutable Tensor chunk_;  // (chunk_rows_, V) logits, then probabilities, then their gradient
  int64_t chunk_rows_;  // model.logit_chunk_rows, or a test's
  mutable std::shared_ptr<HeadGrads> shared_grads_;
};

}  // namespace pf
