// LlamaBlock: a Llama-style decoder layer (nn/blocks.hpp).
#include "nn/block_helpers.hpp"
#include "nn/blocks.hpp"
#include "nn/names.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace pf {

using namespace block_helpers;

struct LlamaState : BlockState {
  Tensor x;              // (N, C) the block's input, kept for the backward
  Tensor h1, h2;         // (N, C) RMS1(x), RMS2(r1): the projections' inputs
  Tensor rstd1, rstd2;   // (N)
  Tensor q, k, v;        // (N, C), (N, KV), (N, KV); q and k after the rotation
  Tensor kx, vx;         // (N, C) k and v repeated for each query head of their group
  Tensor probs;          // (B, H, T, T) attention softmax
  Tensor a, r1;          // (N, C) attention output; r1 = x + a Wo
  Tensor gate, up, s;    // (N, F) h2 Wg, h2 Wu, silu(gate) * up
  std::vector<uint8_t> keep1, keep2;  // dropout masks after the attention and MLP projections
  int64_t bytes() const override {
    return bytes_of({&x, &h1, &h2, &rstd1, &rstd2, &q, &k, &v, &kx, &vx, &probs, &a, &r1, &gate, &up, &s}) +
           static_cast<int64_t>(keep1.size() + keep2.size());
  }
};

// The output gradients of the block's Linears, from I to W.
struct LlamaGrads : OutputGrads {
  Tensor q, k, v, o, gate, up, down;  // (N, C), (N, KV), (N, KV), (N, C), (N, F), (N, F), (N, C)
  void fit(int64_t N, int64_t C, int64_t KV, int64_t F) {
    for (Tensor* t : {&q, &o, &down}) reserve(*t, N * C);
    for (Tensor* t : {&k, &v}) reserve(*t, N * KV);
    for (Tensor* t : {&gate, &up}) reserve(*t, N * F);
  }
  int64_t bytes() const override { return bytes_of({&q, &k, &v, &o, &gate, &up, &down}); }
};

namespace {

// Grouped-query attention's key/value heads for every query head: head h of kx is head
// h / (H / KVH) of k. (N, KVH x D) -> (N, H x D).
void repeat_kv(float* out, const float* in, int64_t N, int64_t H, int64_t KVH, int64_t D) {
  const int64_t group = H / KVH;
#pragma omp parallel for schedule(static) if (N * H * D > (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      std::copy_n(in + (n * KVH + h / group) * D, D, out + (n * H + h) * D);
}

// Its backward: each key/value head's gradient is the sum over its group, in head order.
void sum_kv_groups(float* out, const float* in, int64_t N, int64_t H, int64_t KVH, int64_t D) {
  const int64_t group = H / KVH;
#pragma omp parallel for schedule(static) if (N * H * D > (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < KVH; ++j) {
      float* o = out + (n * KVH + j) * D;
      std::copy_n(in + (n * H + j * group) * D, D, o);
      for (int64_t g = 1; g < group; ++g) {
        const float* d = in + (n * H + j * group + g) * D;
        for (int64_t i = 0; i < D; ++i) o[i] += d[i];
      }
    }
}

}  // namespace

LlamaBlock::LlamaBlock(const ModelConfig& cfg, int layer)
    : cfg_(cfg),
      name_("model.layers." + std::to_string(layer)),
      D_(cfg.hidden / cfg.heads),
      KVH_(kv_heads_of(cfg)),
      KV_(kv_width(cfg)),
      rope_(cfg.hidden / cfg.heads, cfg.max_position, cfg.rope_theta) {
  PF_CHECK(cfg.hidden % cfg.heads == 0 && cfg.heads % kv_heads_of(cfg) == 0, "{}: {} heads over {} key/value heads of {}",
           name_, cfg.heads, kv_heads_of(cfg), cfg.hidden);
  const int64_t C = cfg.hidden, F = cfg.ffn;
  const std::vector<std::string> n = block_linear_names(Arch::Llama, layer);
  auto linear = [&](int k, int64_t in, int64_t out) { return std::make_unique<Linear>(n[k] + ".weight", "", in, out); };
  q_ = linear(0, C, C), k_ = linear(1, C, KV_), v_ = linear(2, C, KV_), o_ = linear(3, C, C);
  gate_ = linear(4, C, F), up_ = linear(5, C, F), down_ = linear(6, F, C);
  norm1_ = std::make_unique<RmsNorm>(name_ + ".input_layernorm", C, cfg.layer_norm_eps);
  norm2_ = std::make_unique<RmsNorm>(name_ + ".post_attention_layernorm", C, cfg.layer_norm_eps);
  drop_attn_key_ = stream_key(0, name_ + ".self_attn.resid_dropout");
  drop_mlp_key_ = stream_key(0, name_ + ".mlp.dropout");
}

std::vector<Linear*> LlamaBlock::in_order() const {
  return {q_.get(), k_.get(), v_.get(), o_.get(), gate_.get(), up_.get(), down_.get()};
}

// Hugging Face's order: input_layernorm, self_attn, post_attention_layernorm, mlp.
std::vector<Param*> LlamaBlock::params() {
  std::vector<Param*> ps{&norm1_->weight};
  for (Linear* l : in_order()) {
    ps.push_back(&l->weight());
    if (l == o_.get()) ps.push_back(&norm2_->weight);
  }
  return ps;
}

std::vector<Linear*> LlamaBlock::linears() { return in_order(); }

void LlamaBlock::init(uint64_t seed) {
  for (Linear* l : in_order()) init_normal(l->weight(), seed, cfg_.init_std);  // as LlamaPreTrainedModel
  norm1_->weight.value.fill(1.0f);
  norm2_->weight.value.fill(1.0f);
}

std::unique_ptr<BlockState> LlamaBlock::make_state(int max_rows, int seq, BackwardMode mode) const {
  PF_CHECK(seq <= rope_.positions, "{}: seq {} > max_position {}", name_, seq, rope_.positions);
  auto st = std::make_unique<LlamaState>();
  const int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  for (Tensor* t : {&st->x, &st->h1, &st->h2, &st->q, &st->kx, &st->vx, &st->a, &st->r1}) *t = Tensor({N, C});
  for (Tensor* t : {&st->k, &st->v}) *t = Tensor({N, KV_});
  for (Tensor* t : {&st->rstd1, &st->rstd2}) *t = Tensor({N});
  for (Tensor* t : {&st->gate, &st->up, &st->s}) *t = Tensor({N, F});
  st->probs = Tensor({static_cast<int64_t>(max_rows), H, seq, seq});
  if (cfg_.dropout > 0) {
    st->keep1.resize(N * C);
    st->keep2.resize(N * C);
  }
  for (Tensor* t : {&d_a_, &d_b_, &d_k_, &d_v_}) reserve(*t, N * C);
  reserve(d_f_, N * F);
  st->mode = mode;
  st->grads = output_grads(mode, shared_grads_, N, C, KV_, F);
  reserve(attn_scratch_, attention_scratch_floats(seq, std::max(omp_get_max_threads(), omp_get_num_procs())));
  return st;
}

float LlamaBlock::forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& bs) {
  auto& st = static_cast<LlamaState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  PF_CHECK(st.x.numel() >= N * C, "{}: micro-batch of {} tokens in a state made for {}", name_, N, st.x.numel() / C);
  check_holds(x_in, N * C, "x_in");
  check_holds(x_out, N * C, "x_out");
  copy(st.x.data(), x_in.data(), N * C);
  norm1_->forward(st.h1.data(), st.rstd1.data(), st.x.data(), N);
  q_->forward(i, st.h1.data(), N, st.q.data());
  k_->forward(i, st.h1.data(), N, st.k.data());
  v_->forward(i, st.h1.data(), N, st.v.data());
  rope_.rotate(st.q.data(), C, H, N, T, 0, false);
  rope_.rotate(st.k.data(), KV_, KVH_, N, T, 0, false);
  repeat_kv(st.kx.data(), st.k.data(), N, H, KVH_, D_);
  repeat_kv(st.vx.data(), st.v.data(), N, H, KVH_, D_);
  attention_forward(st.a.data(), st.probs.data(), st.q.data(), st.kx.data(), st.vx.data(), C, B, T, H, D_,
                    /*causal=*/true, nullptr);
  o_->forward(i, st.a.data(), N, st.r1.data());
  if (training_ && cfg_.dropout > 0) dropout_forward(st.r1.data(), st.keep1.data(), N * C, cfg_.dropout, dropout_rng(drop_attn_key_, i));
  add_inplace(st.r1.data(), st.x.data(), N * C);
  norm2_->forward(st.h2.data(), st.rstd2.data(), st.r1.data(), N);
  gate_->forward(i, st.h2.data(), N, st.gate.data());
  up_->forward(i, st.h2.data(), N, st.up.data());
  swiglu_forward(st.s.data(), st.gate.data(), st.up.data(), N, F, F);
  float* out = x_out.data();
  down_->forward(i, st.s.data(), N, out);
  if (training_ && cfg_.dropout > 0) dropout_forward(out, st.keep2.data(), N * C, cfg_.dropout, dropout_rng(drop_mlp_key_, i));
  add_inplace(out, st.r1.data(), N * C);
  return 0.0f;
}

void LlamaBlock::backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& bs) {
  auto& st = static_cast<LlamaState&>(bs);
  auto& g = begin_weight_grads<LlamaGrads>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden, F = cfg_.ffn;
  const int i = mb.index;
  const float p = cfg_.dropout;
  check_holds(dx_out, N * C, "dx_out");
  check_holds(dx_in, N * C, "dx_in");
  PF_CHECK(d_a_.capacity() >= N * C, "{}: backward scratch smaller than the micro-batch", name_);
  const float* dout = dx_out.data();
  float *dx = dx_in.data(), *dA = d_a_.data(), *dS = d_f_.data();
  // out = r1 + Drop(down(s)): the MLP branch sees Drop'(dout)
  dropout_grad(g.down.data(), dout, st.keep2, N * C, p);
  down_->backward_input(i, g.down.data(), N, dS);                                          // dS = ds
  swiglu_backward(g.gate.data(), g.up.data(), dS, st.gate.data(), st.up.data(), N, F, F);  // dgate, dup
  gate_->backward_input(i, g.gate.data(), N, dA);
  up_->backward_input(i, g.up.data(), N, dA, /*accumulate=*/true);                          // dA = dh2
  copy(dx, dout, N * C);                                                                    // dx accumulates dr1
  norm2_->backward(dx, dA, st.r1.data(), st.rstd2.data(), N, true);
  dropout_grad(g.o.data(), dx, st.keep1, N * C, p);
  o_->backward_input(i, g.o.data(), N, dA);                                                 // dA = da
  attention_backward_to_qkv(mb, dA, st, g);
  q_->backward_input(i, g.q.data(), N, dA);
  k_->backward_input(i, g.k.data(), N, dA, true);
  v_->backward_input(i, g.v.data(), N, dA, true);                                           // dA = dh1
  // r1 = x + ...: dx = dr1 + RMS1'(dh1)
  norm1_->backward(dx, dA, st.x.data(), st.rstd1.data(), N, true);
}

// da -> the q, k and v projections' output gradients: the attention's backward over the repeated
// keys and values, each group summed back to its key/value head, and the rotation undone.
void LlamaBlock::attention_backward_to_qkv(const MicroBatch& mb, const float* da, BlockState& bs, LlamaGrads& g) {
  auto& st = static_cast<LlamaState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, H = cfg_.heads, KVH = KVH_;
  float *dkx = d_k_.data(), *dvx = d_v_.data();
  attention_backward(g.q.data(), dkx, dvx, C, attn_scratch_.data(), attn_scratch_.capacity(), da, st.probs.data(),
                     st.q.data(), st.kx.data(), st.vx.data(), C, B, T, H, D_);
  sum_kv_groups(g.k.data(), dkx, N, H, KVH, D_);
  sum_kv_groups(g.v.data(), dvx, N, H, KVH, D_);
  rope_.rotate(g.q.data(), C, H, N, T, 0, true);
  rope_.rotate(g.k.data(), KV_, KVH, N, T, 0, true);
}

// Each Linear's dW += dy^T x from the output gradient its I kept and its forward input.
void LlamaBlock::backward_weight(const MicroBatch& mb, BlockState& bs) {
  auto& st = static_cast<LlamaState&>(bs);
  const auto& g = end_weight_grads<LlamaGrads>(bs, name_);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq;
  down_->backward_weight(g.down.data(), st.s.data(), N);
  gate_->backward_weight(g.gate.data(), st.h2.data(), N);
  up_->backward_weight(g.up.data(), st.h2.data(), N);
  o_->backward_weight(g.o.data(), st.a.data(), N);
  q_->backward_weight(g.q.data(), st.h1.data(), N);
  k_->backward_weight(g.k.data(), st.h1.data(), N);
  v_->backward_weight(g.v.data(), st.h1.data(), N);
}

// forward for one token against the cache: the same operations on one row, without dropout.
void LlamaBlock::decode(float* x, int position, Tensor& k, Tensor& v) const {
  const int64_t C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads, T = position + 1;
  PF_CHECK(k.numel() >= T * KV_ && v.numel() >= T * KV_, "KV cache of {} rows at position {}", k.numel() / KV_, position);
  std::vector<float> h(static_cast<size_t>(C)), q(h.size()), a(h.size()), r1(h.size()), gate(static_cast<size_t>(F)),
      up(gate.size()), s(gate.size()), scores(static_cast<size_t>(T));
  float rstd = 0;
  float *krow = k.data() + position * KV_, *vrow = v.data() + position * KV_;
  norm1_->forward(h.data(), &rstd, x, 1);
  q_->forward(0, h.data(), 1, q.data());
  k_->forward(0, h.data(), 1, krow);
  v_->forward(0, h.data(), 1, vrow);
  rope_.rotate(q.data(), C, H, 1, 1, position, false);
  rope_.rotate(krow, KV_, KVH_, 1, 1, position, false);
  attention_decode(a.data(), scores.data(), q.data(), k.data(), v.data(), T, H, D_, KVH_);
  o_->forward(0, a.data(), 1, r1.data());
  add_inplace(r1.data(), x, C);
  norm2_->forward(h.data(), &rstd, r1.data(), 1);
  gate_->forward(0, h.data(), 1, gate.data());
  up_->forward(0, h.data(), 1, up.data());
  swiglu_forward(s.data(), gate.data(), up.data(), 1, F, F);
  down_->forward(0, s.data(), 1, x);
  add_inplace(x, r1.data(), C);
}

}  // namespace pf
