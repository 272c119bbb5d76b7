#include "nn/blocks.hpp"
#include "nn/names.hpp"

#include "core/error.hpp"
#include "core/parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pf {

namespace {

// Grows a shared temporary at set-up time (never during forward/backward).
void reserve(Tensor& t, int64_t n) {
  if (t.capacity() < n) t = Tensor(Shape{n});
}

void copy(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(dynamic, kPieceElements / 4096) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst + i, src + i, std::min<int64_t>(4096, n - i) * sizeof(float));
}

void init_layernorm(LayerNorm& ln) {
  ln.weight.value.fill(1.0f);
  ln.bias.value.zero();
}

// Checks that a caller's activation tensor can hold n floats (no allocation on the way).
void check_holds(const Tensor& t, int64_t n, const char* what) {
  PF_CHECK(t.numel() >= n, "{} holds {} floats, needs {}", what, t.numel(), n);
}

}  // namespace

void init_normal(Param& p, uint64_t seed, float std) {
  CounterRng rng{stream_key(seed, p.name)};
  float* v = p.value.data();
  int64_t n = p.value.numel();
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) v[i] = std * rng.normal(static_cast<uint64_t>(i));
}

// ============================================================================ embedding
struct EmbeddingState : BlockState {
  Tensor e, mean, rstd;        // bert: the sum before LayerNorm, and its statistics
  std::vector<uint8_t> keep;   // dropout mask
  int64_t bytes() const override { return bytes_of({&e, &mean, &rstd}) + static_cast<int64_t>(keep.size()); }
};

EmbeddingBlock::EmbeddingBlock(const ModelConfig& cfg)
    : cfg_(cfg),
      bert_(cfg.arch == Arch::Bert),
      wte_(bert_ ? "bert.embeddings.word_embeddings.weight" : "transformer.wte.weight", Shape{cfg.vocab, cfg.hidden}),
      wpe_(bert_ ? "bert.embeddings.position_embeddings.weight" : "transformer.wpe.weight",
           Shape{cfg.max_position, cfg.hidden}),
      drop_key_(stream_key(0, bert_ ? "bert.embeddings.dropout" : "transformer.drop")) {
  if (bert_) {
    wtt_ = Param("bert.embeddings.token_type_embeddings.weight", Shape{cfg.type_vocab, cfg.hidden});
    ln_ = std::make_unique<LayerNorm>("bert.embeddings.LayerNorm", cfg.hidden, cfg.layer_norm_eps);
  }
}

std::vector<Param*> EmbeddingBlock::params() {
  if (!bert_) return {&wte_, &wpe_};
  return {&wte_, &wpe_, &wtt_, &ln_->weight, &ln_->bias};
}

void EmbeddingBlock::init(uint64_t seed) {
  for (Param* p : {&wte_, &wpe_}) init_normal(*p, seed, cfg_.init_std);
  if (bert_) {
    init_normal(wtt_, seed, cfg_.init_std);
    init_layernorm(*ln_);
  }
}

std::unique_ptr<BlockState> EmbeddingBlock::make_state(int max_rows, int seq) const {
  PF_CHECK(seq <= cfg_.max_position, "seq {} > max_position {}", seq, cfg_.max_position);
  auto st = std::make_unique<EmbeddingState>();
  int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden;
  if (bert_) {
    st->e = Tensor({N, C});
    st->mean = Tensor({N});
    st->rstd = Tensor({N});
    reserve(d_b_, N * C);
  }
  if (cfg_.dropout > 0) {
    st->keep.resize(N * C);
    reserve(d_a_, N * C);
  }
  return st;
}

float EmbeddingBlock::forward(const MicroBatch& mb, const Tensor&, Tensor& x_out, BlockState& bs) {
  // tokens (N) -> x_out (N, C) = [LayerNorm](wte[token] + wpe[t] [+ wtt[type]]), then dropout
  auto& st = static_cast<EmbeddingState&>(bs);
  int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  check_holds(x_out, N * C, "embedding x_out");
  PF_CHECK(static_cast<int64_t>(mb.tokens.size()) >= N, "micro-batch has {} tokens, needs {}", mb.tokens.size(), N);
  bool in_range = true;
  for (int64_t n = 0; n < N; ++n) in_range &= (mb.tokens[n] >= 0) & (mb.tokens[n] < cfg_.vocab);
  PF_CHECK(in_range, "token id outside the vocabulary of {}", cfg_.vocab);
  const int32_t* types = mb.token_types.empty() ? nullptr : mb.token_types.data();
  if (bert_) {
    embedding_forward(st.e.data(), mb.tokens.data(), types, wte_.value.data(), wpe_.value.data(),
                      wtt_.value.data(), N, mb.seq, C);
    ln_->forward(x_out.data(), st.mean.data(), st.rstd.data(), st.e.data(), N);
  } else {
    embedding_forward(x_out.data(), mb.tokens.data(), nullptr, wte_.value.data(), wpe_.value.data(), nullptr, N,
                      mb.seq, C);
  }
  if (training_ && cfg_.dropout > 0) dropout_forward(x_out.data(), st.keep.data(), N * C, cfg_.dropout, dropout_rng(drop_key_, mb.index));
  return 0.0f;
}

void EmbeddingBlock::backward(const MicroBatch& mb, const Tensor& dx_out, Tensor&, BlockState& bs) {
  auto& st = static_cast<EmbeddingState&>(bs);
  int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  const float* d = dx_out.data();
  if (cfg_.dropout > 0) {
    PF_CHECK(d_a_.capacity() >= N * C, "embedding backward scratch");
    copy(d_a_.data(), d, N * C);
    dropout_backward(d_a_.data(), st.keep.data(), N * C, cfg_.dropout);
    d = d_a_.data();
  }
  if (bert_) {
    PF_CHECK(d_b_.capacity() >= N * C, "embedding backward scratch");
    ln_->backward(d_b_.data(), d, st.e.data(), st.mean.data(), st.rstd.data(), N, false);
    d = d_b_.data();
  }
  const int32_t* types = mb.token_types.empty() ? nullptr : mb.token_types.data();
  embedding_backward(wte_.grad.data(), wpe_.grad.data(), bert_ ? wtt_.grad.data() : nullptr, d, mb.tokens.data(),
                     types, N, mb.seq, C);
}

// ============================================================================ transformer block
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

std::vector<std::string> block_linear_names(Arch arch, int layer) {
  std::vector<std::string> names;
  if (arch == Arch::Bert)
    for (const char* n : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                          "intermediate.dense", "output.dense"})
      names.push_back("bert.encoder.layer." + std::to_string(layer) + "." + n);
  if (arch == Arch::Gpt)
    for (const char* n : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
      names.push_back("transformer.h." + std::to_string(layer) + "." + n);
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
    for (int k = 0; k < 4; ++k) lin_.push_back(std::make_unique<Linear>(n[k] + ".weight", n[k] + ".bias", C, C));
    lin_.push_back(std::make_unique<Linear>(n[4] + ".weight", n[4] + ".bias", C, F));
    lin_.push_back(std::make_unique<Linear>(n[5] + ".weight", n[5] + ".bias", F, C));
    ln1_ = std::make_unique<LayerNorm>(p + "attention.output.LayerNorm", C, eps);
    ln2_ = std::make_unique<LayerNorm>(p + "output.LayerNorm", C, eps);
    drop_attn_key_ = stream_key(0, p + "attention.output.dropout");
    drop_mlp_key_ = stream_key(0, p + "output.dropout");
  } else {
    name_ = "transformer.h." + std::to_string(layer);
    const std::string p = name_ + ".";
    const std::vector<std::string> n = block_linear_names(Arch::Gpt, layer);
    lin_.push_back(std::make_unique<Linear>(n[0] + ".weight", n[0] + ".bias", C, 3 * C, true));
    lin_.push_back(std::make_unique<Linear>(n[1] + ".weight", n[1] + ".bias", C, C, true));
    lin_.push_back(std::make_unique<Linear>(n[2] + ".weight", n[2] + ".bias", C, F, true));
    lin_.push_back(std::make_unique<Linear>(n[3] + ".weight", n[3] + ".bias", F, C, true));
    ln1_ = std::make_unique<LayerNorm>(p + "ln_1", C, eps);
    ln2_ = std::make_unique<LayerNorm>(p + "ln_2", C, eps);
    drop_attn_key_ = stream_key(0, p + "attn.resid_dropout");
    drop_mlp_key_ = stream_key(0, p + "mlp.dropout");
  }
}

std::vector<Param*> TransformerBlock::params() {
  std::vector<Param*> ps;
  auto add_ln = [&](LayerNorm& ln) { ps.push_back(&ln.weight), ps.push_back(&ln.bias); };
  if (!bert_) add_ln(*ln1_);
  for (size_t i = 0; i < lin_.size(); ++i) {
    ps.push_back(&lin_[i]->weight());
    ps.push_back(lin_[i]->bias());
    if (bert_ && i == 3) add_ln(*ln1_);   // HF order: attention.output.{dense, LayerNorm}
    if (!bert_ && i == 1) add_ln(*ln2_);  // ln_2 before the MLP
  }
  if (bert_) add_ln(*ln2_);
  return ps;
}

std::vector<Linear*> TransformerBlock::linears() {
  std::vector<Linear*> ls;
  for (auto& l : lin_) ls.push_back(l.get());
  return ls;
}

void TransformerBlock::init(uint64_t seed) {
  for (size_t i = 0; i < lin_.size(); ++i) {
    float std = cfg_.init_std;
    // GPT-2 scales the residual projections by 1/sqrt(2 * layers) (as Hugging Face's _init_weights).
    if (!bert_ && (i == 1 || i == 3)) std /= std::sqrt(2.0f * cfg_.layers);
    init_normal(lin_[i]->weight(), seed, std);
    lin_[i]->bias()->value.zero();
  }
  init_layernorm(*ln1_);
  init_layernorm(*ln2_);
}

std::unique_ptr<BlockState> TransformerBlock::make_state(int max_rows, int seq) const {
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
  reserve(d_f_, N * F);
  reserve(d_qkv_, N * 3 * C);
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

void TransformerBlock::backward(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  check_holds(dx_out, N * C, "dx_out");
  check_holds(dx_in, N * C, "dx_in");
  PF_CHECK(d_a_.capacity() >= N * C, "{}: backward scratch smaller than the micro-batch", name_);
  if (bert_)
    backward_bert(mb, dx_out.data(), dx_in.data(), st);
  else
    backward_gpt(mb, dx_out.data(), dx_in.data(), st);
}

// BERT, post-LN:  r1 = x + Drop(Attn(x) Wo);  h1 = LN1(r1);  r2 = h1 + Drop(GELU(h1 Wfc) Wout);  out = LN2(r2)
float TransformerBlock::forward_bert(const MicroBatch& mb, float* out, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  Linear &wq = *lin_[0], &wk = *lin_[1], &wv = *lin_[2], &wo = *lin_[3], &wfc = *lin_[4], &wout = *lin_[5];
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

void TransformerBlock::backward_bert(const MicroBatch& mb, const float* dout, float* dx, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  const float p = cfg_.dropout;
  Linear &wq = *lin_[0], &wk = *lin_[1], &wv = *lin_[2], &wo = *lin_[3], &wfc = *lin_[4], &wout = *lin_[5];
  float *dA = d_a_.data(), *dB = d_b_.data(), *dC = d_c_.data(), *dF = d_f_.data();
  // out = LN2(r2): dB = dr2
  ln2_->backward(dB, dout, st.h2r2.data(), st.mean2.data(), st.rstd2.data(), N, false);
  // r2 = h1 + Drop(mlp): the MLP branch sees Drop'(dr2)
  const float* dm = dB;
  if (p > 0) {
    copy(dA, dB, N * C);
    dropout_backward(dA, st.keep2.data(), N * C, p);
    dm = dA;
  }
  wout.backward(i, dm, st.g.data(), N, dF);                 // dF = dg
  gelu_backward(dF, st.f.data(), dF, N * F, gelu_);         // dF = df
  wfc.backward(i, dF, st.h1.data(), N, dB, /*accumulate=*/true);  // dB = dh1 = dr2 + df Wfc
  // h1 = LN1(r1): dA = dr1
  ln1_->backward(dA, dB, st.r1.data(), st.mean1.data(), st.rstd1.data(), N, false);
  const float* dproj = dA;
  if (p > 0) {
    copy(dC, dA, N * C);
    dropout_backward(dC, st.keep1.data(), N * C, p);
    dproj = dC;
  }
  wo.backward(i, dproj, st.a.data(), N, dB);  // dB = da
  float *dq = d_qkv_.data(), *dk = dq + N * C, *dv = dk + N * C;
  attention_backward(dq, dk, dv, C, attn_scratch_.data(), attn_scratch_.capacity(), dB, st.probs.data(), st.q.data(),
                     st.k.data(), st.v.data(), C, B, T, H, C / H);
  // r1 = x + ...: dx = dr1 + dq Wq + dk Wk + dv Wv
  copy(dx, dA, N * C);
  wq.backward(i, dq, st.x.data(), N, dx, true);
  wk.backward(i, dk, st.x.data(), N, dx, true);
  wv.backward(i, dv, st.x.data(), N, dx, true);
}

// GPT-2, pre-LN:  r1 = x + Drop(Attn(LN1(x)) Wproj);  out = r1 + Drop(GELU(LN2(r1) Wfc) Wproj2)
float TransformerBlock::forward_gpt(const MicroBatch& mb, float* out, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  Linear &wqkv = *lin_[0], &wproj = *lin_[1], &wfc = *lin_[2], &wproj2 = *lin_[3];
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

void TransformerBlock::backward_gpt(const MicroBatch& mb, const float* dout, float* dx, BlockState& bs) {
  auto& st = static_cast<TransformerState&>(bs);
  const int64_t B = mb.rows, T = mb.seq, N = B * T, C = cfg_.hidden, F = cfg_.ffn, H = cfg_.heads;
  const int i = mb.index;
  const float p = cfg_.dropout;
  Linear &wqkv = *lin_[0], &wproj = *lin_[1], &wfc = *lin_[2], &wproj2 = *lin_[3];
  float *dA = d_a_.data(), *dB = d_b_.data(), *dC = d_c_.data(), *dF = d_f_.data(), *dqkv = d_qkv_.data();
  // out = r1 + Drop(mlp): the MLP branch sees Drop'(dout)
  const float* dm = dout;
  if (p > 0) {
    copy(dA, dout, N * C);
    dropout_backward(dA, st.keep2.data(), N * C, p);
    dm = dA;
  }
  wproj2.backward(i, dm, st.g.data(), N, dF);          // dF = dg
  gelu_backward(dF, st.f.data(), dF, N * F, gelu_);    // dF = df
  wfc.backward(i, dF, st.h2r2.data(), N, dB);          // dB = dh2
  copy(dx, dout, N * C);                               // dx accumulates dr1 = dout + LN2'(dh2)
  ln2_->backward(dx, dB, st.r1.data(), st.mean2.data(), st.rstd2.data(), N, true);
  const float* dproj = dx;
  if (p > 0) {
    copy(dA, dx, N * C);
    dropout_backward(dA, st.keep1.data(), N * C, p);
    dproj = dA;
  }
  wproj.backward(i, dproj, st.a.data(), N, dC);        // dC = da
  const float* qkv = st.qkv.data();
  attention_backward(dqkv, dqkv + C, dqkv + 2 * C, 3 * C, attn_scratch_.data(), attn_scratch_.capacity(), dC,
                     st.probs.data(), qkv, qkv + C, qkv + 2 * C, 3 * C, B, T, H, C / H);
  wqkv.backward(i, dqkv, st.h1.data(), N, dB);         // dB = dh1
  // r1 = x + ...: dx = dr1 + LN1'(dh1)
  ln1_->backward(dx, dB, st.x.data(), st.mean1.data(), st.rstd1.data(), N, true);
}

// ============================================================================ head
struct HeadState : BlockState {
  std::vector<int32_t> rows, labels;  // the token rows with a label, and their labels
  int64_t M = 0;                      // how many
  Tensor xs;                          // (M, C) gathered input rows
  Tensor t, g;                        // bert: (M, C) transform dense output, after GELU
  Tensor h, mean, rstd;               // (M, C) LayerNorm output (decoder input), (M) statistics
  Tensor logits;                      // (M, V) logits, then probabilities, then dlogits
  Tensor loss;                        // (M) token losses
  // BERT next-sentence prediction over the [CLS] rows of the sequences with an NSP label.
  std::vector<int32_t> nsp_rows, nsp_labels;  // (K) sequence index, label
  int64_t K = 0;
  Tensor xc, pooled;                  // (K, C) [CLS] inputs; tanh(pooler) output
  Tensor nsp_logits, nsp_loss;        // (K, 2) logits, then probabilities, then dlogits; (K)
  int64_t bytes() const override {
    const size_t ints = rows.size() + labels.size() + nsp_rows.size() + nsp_labels.size();
    return bytes_of({&xs, &t, &g, &h, &mean, &rstd, &logits, &loss, &xc, &pooled, &nsp_logits, &nsp_loss}) +
           static_cast<int64_t>(ints * sizeof(int32_t));
  }
};

HeadBlock::HeadBlock(const ModelConfig& cfg, Param* tied_word) : cfg_(cfg), bert_(cfg.arch == Arch::Bert) {
  const int64_t C = cfg.hidden;
  if (!tied_word) {
    mirror_ = std::make_unique<Param>(bert_ ? "bert.embeddings.word_embeddings.weight" : "transformer.wte.weight",
                                      Shape{cfg.vocab, C});
    mirror_->mirror = true;
    tied_word = mirror_.get();
  }
  if (bert_) {
    transform_ = std::make_unique<Linear>("cls.predictions.transform.dense.weight",
                                          "cls.predictions.transform.dense.bias", C, C);
    ln_ = std::make_unique<LayerNorm>("cls.predictions.transform.LayerNorm", C, cfg.layer_norm_eps);
    decoder_ = std::make_unique<Linear>(tied_word, "cls.predictions.bias");
    pooler_ = std::make_unique<Linear>("bert.pooler.dense.weight", "bert.pooler.dense.bias", C, C);
    nsp_ = std::make_unique<Linear>("cls.seq_relationship.weight", "cls.seq_relationship.bias", C, 2);
    // Without data.nsp nothing trains them: no weight decay either, so they keep their initial values.
    pooler_->weight().decay = nsp_->weight().decay = cfg.nsp;  // biases: never
    // The NSP loss is a mean over the sequences, one row each here: K-FAC's loss scale is 1/rows.
    pooler_->set_row_mean_loss(true);
    nsp_->set_row_mean_loss(true);
  } else {
    ln_ = std::make_unique<LayerNorm>("transformer.ln_f", C, cfg.layer_norm_eps);
    decoder_ = std::make_unique<Linear>(tied_word, "");
  }
}

std::vector<Param*> HeadBlock::params() {
  std::vector<Param*> ps;
  if (bert_)
    ps = {&transform_->weight(), transform_->bias(), &ln_->weight, &ln_->bias, decoder_->bias(),
          &pooler_->weight(), pooler_->bias(), &nsp_->weight(), nsp_->bias()};
  else ps = {&ln_->weight, &ln_->bias};
  if (mirror_) ps.push_back(mirror_.get());
  return ps;
}

std::vector<Linear*> HeadBlock::linears() {
  if (bert_ && cfg_.nsp) return {transform_.get(), decoder_.get(), pooler_.get(), nsp_.get()};
  if (bert_) return {transform_.get(), decoder_.get()};
  return {decoder_.get()};
}

void HeadBlock::init(uint64_t seed) {
  if (bert_) {
    init_normal(transform_->weight(), seed, cfg_.init_std);
    transform_->bias()->value.zero();
    decoder_->bias()->value.zero();
    init_normal(pooler_->weight(), seed, cfg_.init_std);
    pooler_->bias()->value.zero();
    init_normal(nsp_->weight(), seed, cfg_.init_std);
    nsp_->bias()->value.zero();
  }
  init_layernorm(*ln_);
  if (mirror_) init_normal(*mirror_, seed, cfg_.init_std);  // same name => same values as the owner
}

std::unique_ptr<BlockState> HeadBlock::make_state(int max_rows, int seq) const {
  auto st = std::make_unique<HeadState>();
  const int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden, V = cfg_.vocab;
  st->rows.resize(N);
  st->labels.resize(N);
  for (Tensor* t : {&st->xs, &st->h}) *t = Tensor({N, C});
  if (bert_) st->t = Tensor({N, C}), st->g = Tensor({N, C});
  st->mean = Tensor({N});
  st->rstd = Tensor({N});
  st->logits = Tensor({N, V});
  st->loss = Tensor({N});
  if (bert_) {
    const int64_t R = max_rows;
    st->nsp_rows.resize(R);
    st->nsp_labels.resize(R);
    for (Tensor* t : {&st->xc, &st->pooled}) *t = Tensor({R, C});
    st->nsp_logits = Tensor({R, 2});
    st->nsp_loss = Tensor({R});
  }
  reserve(d_a_, N * C);
  reserve(d_b_, N * C);
  return st;
}

float HeadBlock::forward(const MicroBatch& mb, const Tensor& x_in, Tensor&, BlockState& bs) {
  // x_in (N, C) -> loss = loss_scale * sum over labelled tokens of -log softmax(decoder(...))[label]
  auto& st = static_cast<HeadState&>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden, V = cfg_.vocab;
  PF_CHECK(static_cast<int64_t>(st.rows.size()) >= N, "head: micro-batch larger than its state");
  PF_CHECK(static_cast<int64_t>(mb.labels.size()) >= N, "micro-batch has {} labels, needs {}", mb.labels.size(), N);
  check_holds(x_in, N * C, "head x_in");
  // Only the labelled tokens matter (BERT: the masked 15%): gather them first.
  int64_t M = 0;
  for (int64_t n = 0; n < N; ++n)
    if (mb.labels[n] >= 0) {
      PF_CHECK(mb.labels[n] < V, "label {} >= vocab {}", mb.labels[n], V);
      st.rows[M] = static_cast<int32_t>(n);
      st.labels[M++] = mb.labels[n];
    }
  st.M = M;
  const double nsp = bert_ && cfg_.nsp ? nsp_forward(mb, x_in, st) : 0.0;
  if (M == 0) return static_cast<float>(nsp);
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (M * C > (1 << 16))
  for (int64_t m = 0; m < M; ++m)
    std::memcpy(st.xs.data() + m * C, x_in.data() + st.rows[m] * C, C * sizeof(float));
  const float* hin = st.xs.data();
  if (bert_) {
    transform_->forward(mb.index, st.xs.data(), M, st.t.data());
    gelu_forward(st.g.data(), st.t.data(), M * C, gelu_of(cfg_));
    hin = st.g.data();
  }
  ln_->forward(st.h.data(), st.mean.data(), st.rstd.data(), hin, M);
  decoder_->forward(mb.index, st.h.data(), M, st.logits.data());
  softmax_cross_entropy_forward(st.logits.data(), st.loss.data(), st.labels.data(), M, V);
  double sum = 0;
  for (int64_t m = 0; m < M; ++m) sum += st.loss[m];
  return static_cast<float>(sum * mb.loss_scale + nsp);
}

double HeadBlock::nsp_forward(const MicroBatch& mb, const Tensor& x_in, HeadState& st) {
  // [CLS] rows (K, C) -> pooled = tanh(pooler(xc)) -> logits = seq_relationship(pooled) (K, 2);
  // returns nsp_scale x the summed cross-entropies.
  const int64_t C = cfg_.hidden;
  PF_CHECK(static_cast<int64_t>(mb.nsp_labels.size()) >= mb.rows, "micro-batch has {} NSP labels, needs {}",
           mb.nsp_labels.size(), mb.rows);
  int64_t K = 0;
  for (int r = 0; r < mb.rows; ++r)
    if (mb.nsp_labels[r] >= 0) {
      PF_CHECK(mb.nsp_labels[r] < 2, "NSP label {} is not 0 or 1", mb.nsp_labels[r]);
      st.nsp_rows[K] = r;
      st.nsp_labels[K++] = mb.nsp_labels[r];
    }
  st.K = K;
  if (K == 0) return 0.0;
  for (int64_t k = 0; k < K; ++k)
    std::memcpy(st.xc.data() + k * C, x_in.data() + static_cast<int64_t>(st.nsp_rows[k]) * mb.seq * C, C * sizeof(float));
  pooler_->forward(mb.index, st.xc.data(), K, st.pooled.data());
  for (int64_t i = 0; i < K * C; ++i) st.pooled[i] = std::tanh(st.pooled[i]);
  nsp_->forward(mb.index, st.pooled.data(), K, st.nsp_logits.data());
  softmax_cross_entropy_forward(st.nsp_logits.data(), st.nsp_loss.data(), st.nsp_labels.data(), K, 2);
  double sum = 0;
  for (int64_t k = 0; k < K; ++k) sum += st.nsp_loss[k];
  return sum * mb.nsp_scale;
}

void HeadBlock::nsp_backward(const MicroBatch& mb, Tensor& dx_in, HeadState& st) {
  const int64_t C = cfg_.hidden, K = st.K;
  if (K == 0) return;
  float *dA = d_a_.data(), *dB = d_b_.data();
  softmax_cross_entropy_backward(st.nsp_logits.data(), st.nsp_labels.data(), K, 2, mb.nsp_scale);  // dlogits
  nsp_->backward(mb.index, st.nsp_logits.data(), st.pooled.data(), K, dA);                      // dA = dpooled
  for (int64_t i = 0; i < K * C; ++i) dA[i] *= 1.0f - st.pooled[i] * st.pooled[i];            // through tanh
  pooler_->backward(mb.index, dA, st.xc.data(), K, dB);                                         // dB = dxc
  for (int64_t k = 0; k < K; ++k) {
    float* d = dx_in.data() + static_cast<int64_t>(st.nsp_rows[k]) * mb.seq * C;
    for (int64_t c = 0; c < C; ++c) d[c] += dB[k * C + c];
  }
}

void HeadBlock::logits(const float* x, int64_t rows, float* out) const {
  const int64_t C = cfg_.hidden;
  std::vector<float> t, g, h(static_cast<size_t>(rows * C)), mean(static_cast<size_t>(rows)), rstd(mean.size());
  const float* hin = x;
  if (bert_) {
    t.resize(h.size());
    g.resize(h.size());
    transform_->forward(0, x, rows, t.data());
    gelu_forward(g.data(), t.data(), rows * C, gelu_of(cfg_));
    hin = g.data();
  }
  ln_->forward(h.data(), mean.data(), rstd.data(), hin, rows);
  decoder_->forward(0, h.data(), rows, out);
}

void HeadBlock::backward(const MicroBatch& mb, const Tensor&, Tensor& dx_in, BlockState& bs) {
  auto& st = static_cast<HeadState&>(bs);
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden, V = cfg_.vocab, M = st.M;
  check_holds(dx_in, N * C, "head dx_in");
  std::memset(dx_in.data(), 0, N * C * sizeof(float));
  if (M > 0) {
    float *dA = d_a_.data(), *dB = d_b_.data();
    softmax_cross_entropy_backward(st.logits.data(), st.labels.data(), M, V, mb.loss_scale);  // dlogits
    decoder_->backward(mb.index, st.logits.data(), st.h.data(), M, dA);                        // dA = dh
    const float* dxs = dB;
    if (bert_) {
      ln_->backward(dB, dA, st.g.data(), st.mean.data(), st.rstd.data(), M, false);  // dB = dg
      gelu_backward(dB, st.t.data(), dB, M * C, gelu_of(cfg_));                          // dB = dt
      transform_->backward(mb.index, dB, st.xs.data(), M, dA);                       // dA = dxs
      dxs = dA;
    } else {
      ln_->backward(dB, dA, st.xs.data(), st.mean.data(), st.rstd.data(), M, false);  // dB = dxs
    }
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (M * C > (1 << 16))
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(dx_in.data() + st.rows[m] * C, dxs + m * C, C * sizeof(float));
  }
  // The NSP head's gradient adds into the [CLS] rows (after the masked-LM rows are copied in).
  if (bert_ && cfg_.nsp) nsp_backward(mb, dx_in, st);
}

}  // namespace pf
