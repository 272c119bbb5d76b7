// TransformerBlock: BERT's post-LN and GPT-2's pre-LN encoder/decoder layer (nn/blocks.hpp).
#include "nn/block_helpers.hpp"
#include "nn/blocks.hpp"
#include "nn/names.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace pf {

using namespace block_helpers;

struct TransformerState : BlockState {
  Tensor x;               // (N, C) the block's input, kept for the backward
  Tensor q, k, v;         // bert: (N, C) each
  Tensor qkv;             // gpt: (N, 3C)
  Tensor probs;           // (B, H, T, T) attention softmax
  Tensor a;               // (N, C) attention output, input of the output projection
  Tensor h1, r1, h2r2;    // bert: h1 = LN1(r1), r1 = x + attn, h2r2 = r2 = h1 + mlp
                          // gpt:  h1 = LN1(x),  r1 = x + attn, h2r2 = h2 = LN2(r1)
  Tensor mean1, rstd1, mean2, rstd2;  // (N)
  Tensor f, g;            // (N, F) MLP pre- and post-GELU
  std::vector<uint8_t> keep1, keep2;  // dropout masks after the attention and MLP projections
  int64_t bytes() const override {
    return bytes_of({&x, &q, &k, &v, &qkv, &probs, &a, &h1, &r1, &h2r2, &mean1, &rstd1, &mean2, &rstd2, &f, &g}) +
           static_cast<int64_t>(keep1.size() + keep2.size());
  }
};

// The output gradients of the block's Linears, from I to W: (N, 3C) q, k, v (bert: three (N, C)
// in a row; gpt: c_attn's), (N, C) the attention's output projection, (N, F) the MLP's first
// Linear, (N, C) its second.
struct TransformerGrads : OutputGrads {
  Tensor qkv, proj, fc, mlp_out;
  void fit(int64_t N, int64_t C, int64_t F) {
    reserve(qkv, N * 3 * C);
    reserve(proj, N * C);
    reserve(fc, N * F);
    reserve(mlp_out, N * C);
  }
  int64_t bytes() const override { return bytes_of({&qkv, &proj, &fc, &mlp_out}); }
};

std::vector<std::string> block_linear_names(Arch arch, int layer) {
  std::vector<std::string> names;
  if (arch == Arch::Bert)
    for (const char* n : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                          "intermediate.dense", "output.dense"})
      names.push_back("bert.encoder.layer." + std::to_string(layer) + "." + n);
  if (arch == Arch::Gpt)
    for (const char* n : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
      names.push_back("transformer.h." + std::to_string(layer) + "." + n);
  if (arch == Arch::Llama)
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"})
      names.push_back("model.layers." + std::to_string(layer) + "." + n);
  return names;
}

TransformerBlock::TransformerBlock(const ModelConfig& cfg, int layer)
    : cfg_(cfg), layer_(layer), bert_(cfg.arch == Arch::Bert), gelu_(gelu_of(cfg)) {
  PF_CHECK(cfg.hidden % cfg.heads == 0, "hidden {} not divisible by heads {}", cfg.hidden, cfg.heads);
  const int64_t C = cfg.hidden, F = cfg.ffn;
  const float eps = cfg.layer_norm_eps;
  if (bert_) {
    name_ = "bert.encoder.layer." + std::to_string(layer);
    const std::string p = name_ + ".";
    const std::vector<std::string> n = block_linear_names(Arch::Bert, layer);
    auto linear = [&](int k, int64_t in, int64_t out) {
      return std::make_unique<Linear>(n[k] + ".weight", n[k] + ".bias", in, out);
    };
    bert_lin_ = {linear(0, C, C), linear(1, C, C), linear(2, C, C), linear(3, C, C), linear(4, C, F), linear(5, F, C)};
    ln1_ = std::make_unique<LayerNorm>(p + "attention.output.LayerNorm", C, eps);
    ln2_ = std::make_unique<LayerNorm>(p + "output.LayerNorm", C, eps);
    drop_attn_key_ = stream_key(0, p + "attention.output.dropout");
    drop_mlp_key_ = stream_key(0, p + "output.dropout");
  } else {
    name_ = "transformer.h." + std::to_string(layer);
    const std::string p = name_ + ".";
    const std::vector<std::string> n = block_linear_names(Arch::Gpt, layer);
    auto conv1d = [&](int k, int64_t in, int64_t out) {  // GPT-2's Conv1D: weight stored [in, out]
      return std::make_unique<Linear>(n[k] + ".weight", n[k] + ".bias", in, out, true);
    };
    gpt_lin_ = {conv1d(0, C, 3 * C), conv1d(1, C, C), conv1d(2, C, F), conv1d(3, F, C)};
    ln1_ = std::make_unique<LayerNorm>(p + "ln_1", C, eps);
    ln2_ = std::make_unique<LayerNorm>(p + "ln_2", C, eps);
    drop_attn_key_ = stream_key(0, p + "attn.resid_dropout");
    drop_mlp_key_ = stream_key(0, p + "mlp.dropout");
  }
}

std::vector<Linear*> TransformerBlock::in_order() const {
  if (bert_) {
    const BertLinears& l = bert_lin_;
    return {l.query.get(), l.key.get(), l.value.get(), l.attn_out.get(), l.intermediate.get(), l.output.get()};
  }
  const GptLinears& l = gpt_lin_;
  return {l.c_attn.get(), l.attn_proj.get(), l.c_fc.get(), l.mlp_proj.get()};
}

std::vector<Param*> TransformerBlock::params() {
  std::vector<Param*> ps;
  auto add_ln = [&](LayerNorm& ln) { ps.push_back(&ln.weight), ps.push_back(&ln.bias); };
  if (!bert_) add_ln(*ln1_);
  for (Linear* l : in_order()) {
    ps.push_back(&l->weight());
    ps.push_back(l->bias());
    if (l == bert_lin_.attn_out.get()) add_ln(*ln1_);   // HF order: attention.output.{dense, LayerNorm}
    if (l == gpt_lin_.attn_proj.get()) add_ln(*ln2_);   // ln_2 before the MLP
  }
  if (bert_) add_ln(*ln2_);
  return ps;
}

std::vector<Linear*> TransformerBlock::linears() { return in_order(); }

void TransformerBlock::init(uint64_t seed) {
  for (Linear* l : in_order()) {
    float std = cfg_.init_std;
    // GPT-2 scales the residual projections by 1/sqrt(2 * layers) (as Hugging Face's _init_weights).
    if (l == gpt_lin_.attn_proj.get() || l == gpt_lin_.mlp_proj.get()) std /= std::sqrt(2.0f * cfg_.layers);
    init_normal(l->weight(), seed, std);
    l->bias()->value.zero();
  }
  init_layernorm(*ln1_);
  init_layernorm(*ln2_);
}

std::unique_ptr<BlockState> TransformerBlock::make_state(int max_rows, int seq, BackwardMode mode) const {
  auto st = std::make_unique<TransformerState>();
  const int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  for (Tensor* t : {&st->x, &st->a, &st->h1, &st->r1, &st->h2r2}) *t = Tensor({N, C});
  if (bert_)
    for (Tensor* t : {&st->q, &st->k, &st->v}) *t = Tensor({N, C});
  else
    st->qkv = Tensor({N, 3 * C});
  st->probs = Tensor({static_cast<int64_t>(max_rows), H, seq, seq});
  for (Tensor* t : {&st->mean1, &st->rstd1, &st->mean2, &st->rstd2}) *t = Tensor({N});
  st->f = Tensor({N, F});
  st->g = Tensor({N, F});
  if (cfg_.dropout > 0) {
    st->keep1.resize(N * C);
    st->keep2.resize(N * C);
  }
  for (Tensor* t : {&d_a_, &d_b_, &d_c_}) reserve(*t, N * C);
  st->mode = mode;
  st->grads = output_grads(mode, shared_grads_, N, C, F);
  // One (T, T) matrix per thread; sized for every core so a later set_threads() cannot outgrow it.
  reserve(attn_scratch_, attention_scratch_floats(seq, std::max(omp_get_max_threads(), omp_get_num_procs())));
  return st;
}

float TransformerBlock::forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  PF_CHECK(st.x.numel() >= N * C, "{}: micro-batch of {} tokens in a state made for {}", name_, N, st.x.numel() / C);
  check_holds(x_in, N * C, "x_in");
  check_holds(x_out, N * C, "x_out");
  copy(st.x.data(), x_in.data(), N * C);
  return bert_ ? forward_bert(mb, x_out.data(), st) : forward_gpt(mb, x_out.data(), st);
}

void TransformerBlock::backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  check_holds(dx_out, N * C, "dx_out");
  check_holds(dx_in, N * C, "dx_in");
  PF_CHECK(d_a_.capacity() >= N * C, "{}: backward scratch smaller than the micro-batch", name_);
  if (bert_)
    backward_input_bert(mb, dx_out.data(), dx_in.data(), st);
  else
    backward_input_gpt(mb, dx_out.data(), dx_in.data(), st);
}

// Each Linear's dW += dy^T x from the output gradient its I kept and its forward input.
void TransformerBlock::backward_weight(const MicroBatch& mb, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const auto& g = end_weight_grads<TransformerGrads>(bs, name_);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  if (bert_) {
    Linear &wq = *bert_lin_.query, &wk = *bert_lin_.key, &wv = *bert_lin_.value, &wo = *bert_lin_.attn_out,
         &wfc = *bert_lin_.intermediate, &wout = *bert_lin_.output;
    wout.backward_weight(g.mlp_out.data(), st.g.data(), N);
    wfc.backward_weight(g.fc.data(), st.h1.data(), N);
    wo.backward_weight(g.proj.data(), st.a.data(), N);
    wq.backward_weight(g.qkv.data(), st.x.data(), N);
    wk.backward_weight(g.qkv.data() + N * C, st.x.data(), N);
    wv.backward_weight(g.qkv.data() + 2 * N * C, st.x.data(), N);
  } else {
    Linear &wqkv = *gpt_lin_.c_attn, &wproj = *gpt_lin_.attn_proj, &wfc = *gpt_lin_.c_fc, &wproj2 = *gpt_lin_.mlp_proj;
    wproj2.backward_weight(g.mlp_out.data(), st.g.data(), N);
    wfc.backward_weight(g.fc.data(), st.h2r2.data(), N);
    wproj.backward_weight(g.proj.data(), st.a.data(), N);
    wqkv.backward_weight(g.qkv.data(), st.h1.data(), N);
  }
}

// BERT, post-LN:  r1 = x + Drop(Attn(x) Wo);  h1 = LN1(r1);  r2 = h1 + Drop(GELU(h1 Wfc) Wout);  out = LN2(r2)
float TransformerBlock::forward_bert(const MicroBatch& mb, float* out, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  Linear &wq = *bert_lin_.query, &wk = *bert_lin_.key, &wv = *bert_lin_.value, &wo = *bert_lin_.attn_out,
         &wfc = *bert_lin_.intermediate, &wout = *bert_lin_.output;
  wq.forward(i, st.x.data(), N, st.q.data());
  wk.forward(i, st.x.data(), N, st.k.data());
  wv.forward(i, st.x.data(), N, st.v.data());
  const uint8_t* mask = mb.attn_mask.empty() ? nullptr : mb.attn_mask.data();
  attention_forward(st.a.data(), st.probs.data(), st.q.data(), st.k.data(), st.v.data(), C, B, T, H, C / H,
                    /*causal=*/false, mask);
  wo.forward(i, st.a.data(), N, st.r1.data());
  if (training_ && cfg_.dropout > 0) dropout_forward(st.r1.data(), st.keep1.data(), N * C, cfg_.dropout, dropout_rng(drop_attn_key_, i));
  add_inplace(st.r1.data(), st.x.data(), N * C);
  ln1_->forward(st.h1.data(), st.mean1.data(), st.rstd1.data(), st.r1.data(), N);
  wfc.forward(i, st.h1.data(), N, st.f.data());
  gelu_forward(st.g.data(), st.f.data(), N * F, gelu_);
  wout.forward(i, st.g.data(), N, st.h2r2.data());
  if (training_ && cfg_.dropout > 0) dropout_forward(st.h2r2.data(), st.keep2.data(), N * C, cfg_.dropout, dropout_rng(drop_mlp_key_, i));
  add_inplace(st.h2r2.data(), st.h1.data(), N * C);
  ln2_->forward(out, st.mean2.data(), st.rstd2.data(), st.h2r2.data(), N);
  return 0.0f;
}

void TransformerBlock::backward_input_bert(const MicroBatch& mb, const float* dout, float* dx, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  auto& g = begin_weight_grads<TransformerGrads>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  const float p = cfg_.dropout;
  Linear &wq = *bert_lin_.query, &wk = *bert_lin_.key, &wv = *bert_lin_.value, &wo = *bert_lin_.attn_out,
         &wfc = *bert_lin_.intermediate, &wout = *bert_lin_.output;
  float *dA = d_a_.data(), *dB = d_b_.data(), *dF = g.fc.data();
  // out = LN2(r2): dB = dr2
  ln2_->backward(dB, dout, st.h2r2.data(), st.mean2.data(), st.rstd2.data(), N, false);
  // r2 = h1 + Drop(mlp): the MLP branch sees Drop'(dr2)
  dropout_grad(g.mlp_out.data(), dB, st.keep2, N * C, p);
  wout.backward_input(i, g.mlp_out.data(), N, dF);       // dF = dg
  gelu_backward(dF, st.f.data(), dF, N * F, gelu_);      // dF = df
  wfc.backward_input(i, dF, N, dB, /*accumulate=*/true);  // dB = dh1 = dr2 + df Wfc
  // h1 = LN1(r1): dA = dr1
  ln1_->backward(dA, dB, st.r1.data(), st.mean1.data(), st.rstd1.data(), N, false);
  dropout_grad(g.proj.data(), dA, st.keep1, N * C, p);
  wo.backward_input(i, g.proj.data(), N, dB);  // dB = da
  float *dq = g.qkv.data(), *dk = dq + N * C, *dv = dk + N * C;
  attention_backward(dq, dk, dv, C, attn_scratch_.data(), attn_scratch_.capacity(), dB, st.probs.data(), st.q.data(),
                     st.k.data(), st.v.data(), C, B, T, H, C / H);
  // r1 = x + ...: dx = dr1 + dq Wq + dk Wk + dv Wv
  copy(dx, dA, N * C);
  wq.backward_input(i, dq, N, dx, true);
  wk.backward_input(i, dk, N, dx, true);
  wv.backward_input(i, dv, N, dx, true);
}

// GPT-2, pre-LN:  r1 = x + Drop(Attn(LN1(x)) Wproj);  out = r1 + Drop(GELU(LN2(r1) Wfc) Wproj2)
float TransformerBlock::forward_gpt(const MicroBatch& mb, float* out, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  Linear &wqkv = *gpt_lin_.c_attn, &wproj = *gpt_lin_.attn_proj, &wfc = *gpt_lin_.c_fc, &wproj2 = *gpt_lin_.mlp_proj;
  ln1_->forward(st.h1.data(), st.mean1.data(), st.rstd1.data(), st.x.data(), N);
  wqkv.forward(i, st.h1.data(), N, st.qkv.data());
  const float* qkv = st.qkv.data();
  attention_forward(st.a.data(), st.probs.data(), qkv, qkv + C, qkv + 2 * C, 3 * C, B, T, H, C / H,
                    /*causal=*/true, nullptr);
  wproj.forward(i, st.a.data(), N, st.r1.data());
  if (training_ && cfg_.dropout > 0) dropout_forward(st.r1.data(), st.keep1.data(), N * C, cfg_.dropout, dropout_rng(drop_attn_key_, i));
  add_inplace(st.r1.data(), st.x.data(), N * C);
  ln2_->forward(st.h2r2.data(), st.mean2.data(), st.rstd2.data(), st.r1.data(), N);
  wfc.forward(i, st.h2r2.data(), N, st.f.data());
  gelu_forward(st.g.data(), st.f.data(), N * F, gelu_);
  wproj2.forward(i, st.g.data(), N, out);
  if (training_ && cfg_.dropout > 0) dropout_forward(out, st.keep2.data(), N * C, cfg_.dropout, dropout_rng(drop_mlp_key_, i));
  add_inplace(out, st.r1.data(), N * C);
  return 0.0f;
}

void TransformerBlock::backward_input_gpt(const MicroBatch& mb, const float* dout, float* dx, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  auto& g = begin_weight_grads<TransformerGrads>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  const float p = cfg_.dropout;
  Linear &wqkv = *gpt_lin_.c_attn, &wproj = *gpt_lin_.attn_proj, &wfc = *gpt_lin_.c_fc, &wproj2 = *gpt_lin_.mlp_proj;
  float *dB = d_b_.data(), *dC = d_c_.data(), *dF = g.fc.data(), *dqkv = g.qkv.data();
  // out = r1 + Drop(mlp): the MLP branch sees Drop'(dout)
  dropout_grad(g.mlp_out.data(), dout, st.keep2, N * C, p);
  wproj2.backward_input(i, g.mlp_out.data(), N, dF);  // dF = dg
  gelu_backward(dF, st.f.data(), dF, N * F, gelu_);    // dF = df
  wfc.backward_input(i, dF, N, dB);                    // dB = dh2
  copy(dx, dout, N * C);                               // dx accumulates dr1 = dout + LN2'(dh2)
  ln2_->backward(dx, dB, st.r1.data(), st.mean2.data(), st.rstd2.data(), N, true);
  dropout_grad(g.proj.data(), dx, st.keep1, N * C, p);
  wproj.backward_input(i, g.proj.data(), N, dC);       // dC = da
  const float* qkv = st.qkv.data();
  attention_backward(dqkv, dqkv + C, dqkv + 2 * C, 3 * C, attn_scratch_.data(), attn_scratch_.capacity(), dC,
                     st.probs.data(), qkv, qkv + C, qkv + 2 * C, 3 * C, B, T, H, C / H);
  wqkv.backward_input(i, dqkv, N, dB);                 // dB = dh1
  // r1 = x + ...: dx = dr1 + LN1'(dh1)
  ln1_->backward(dx, dB, st.x.data(), st.mean1.data(), st.rstd1.data(), N, true);
}

}  // namespace pf

namespace pf {

// forward_gpt for one token against the cache: the same operations on one row, without dropout.
void TransformerBlock::decode(float* x, int position, Tensor& k, Tensor& v) const {
  PF_CHECK(!bert_, "decoding needs a causal LM");
  const int64_t C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads, T = position + 1;
  PF_CHECK(k.numel() >= T * C && v.numel() >= T * C, "KV cache of {} rows at position {}", k.numel() / C, position);
  std::vector<float> h(static_cast<size_t>(C)), qkv(static_cast<size_t>(3 * C)), a(h.size()), r1(h.size()),
      f(static_cast<size_t>(F)), g(f.size()), scores(static_cast<size_t>(T));
  float mean = 0, rstd = 0;
  ln1_->forward(h.data(), &mean, &rstd, x, 1);
  gpt_lin_.c_attn->forward(0, h.data(), 1, qkv.data());
  std::copy(qkv.begin() + C, qkv.begin() + 2 * C, k.data() + position * C);
  std::copy(qkv.begin() + 2 * C, qkv.end(), v.data() + position * C);
  attention_decode(a.data(), scores.data(), qkv.data(), k.data(), v.data(), T, H, C / H, H);
  gpt_lin_.attn_proj->forward(0, a.data(), 1, r1.data());
  add_inplace(r1.data(), x, C);
  ln2_->forward(h.data(), &mean, &rstd, r1.data(), 1);
  gpt_lin_.c_fc->forward(0, h.data(), 1, f.data());
  gelu_forward(g.data(), f.data(), F, gelu_);
  gpt_lin_.mlp_proj->forward(0, g.data(), 1, x);
  add_inplace(x, r1.data(), C);
}

}  // namespace pf
