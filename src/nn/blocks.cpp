#include "nn/blocks.hpp"
#include "nn/block_helpers.hpp"

#include "core/error.hpp"
#include "core/parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pf {

using namespace block_helpers;

void init_normal(Param& p, uint64_t seed, float std) {
  CounterRng rng{stream_key(seed, p.name)};
  float* v = p.value.data();
  int64_t n = p.value.numel();
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) v[i] = std * rng.normal(static_cast<uint64_t>(i));
}

void ModelBlock::decode(float*, int, Tensor&, Tensor&) const {
  PF_CHECK(false, "{}: only a causal LM's transformer blocks decode", name());
}

namespace {

// Hugging Face's name of the word matrix (the embedding's, and a head's mirror of it).
const char* word_name(Arch a) {
  return a == Arch::Bert ? "bert.embeddings.word_embeddings.weight"
         : a == Arch::Gpt ? "transformer.wte.weight"
                          : "model.embed_tokens.weight";
}

}  // namespace

// ============================================================================ embedding
struct EmbeddingState : BlockState {
  Tensor e, mean, rstd;        // bert: the sum before LayerNorm, and its statistics
  std::vector<uint8_t> keep;   // dropout mask
  int64_t bytes() const override { return bytes_of({&e, &mean, &rstd}) + static_cast<int64_t>(keep.size()); }
};

// The gradient of the embedding sum (N, C), from I to W (the tables' scatter-add).
struct EmbeddingGrads : OutputGrads {
  Tensor e;
  void fit(int64_t N, int64_t C) { reserve(e, N * C); }
  int64_t bytes() const override { return bytes_of({&e}); }
};

EmbeddingBlock::EmbeddingBlock(const ModelConfig& cfg)
    : cfg_(cfg),
      bert_(cfg.arch == Arch::Bert),
      llama_(cfg.arch == Arch::Llama),
      wte_(word_name(cfg.arch), Shape{cfg.vocab, cfg.hidden}),
      drop_key_(stream_key(0, bert_ ? "bert.embeddings.dropout" : llama_ ? "model.embed_dropout" : "transformer.drop")) {
  if (!llama_)
    wpe_ = Param(bert_ ? "bert.embeddings.position_embeddings.weight" : "transformer.wpe.weight",
                 Shape{cfg.max_position, cfg.hidden});
  if (bert_) {
    wtt_ = Param("bert.embeddings.token_type_embeddings.weight", Shape{cfg.type_vocab, cfg.hidden});
    ln_ = std::make_unique<LayerNorm>("bert.embeddings.LayerNorm", cfg.hidden, cfg.layer_norm_eps);
  }
}

std::vector<Param*> EmbeddingBlock::params() {
  if (llama_) return {&wte_};
  if (!bert_) return {&wte_, &wpe_};
  return {&wte_, &wpe_, &wtt_, &ln_->weight, &ln_->bias};
}

void EmbeddingBlock::init(uint64_t seed) {
  init_normal(wte_, seed, cfg_.init_std);
  if (!llama_) init_normal(wpe_, seed, cfg_.init_std);
  if (bert_) {
    init_normal(wtt_, seed, cfg_.init_std);
    init_layernorm(*ln_);
  }
}

std::unique_ptr<BlockState> EmbeddingBlock::make_state(int max_rows, int seq, BackwardMode mode) const {
  PF_CHECK(seq <= cfg_.max_position, "seq {} > max_position {}", seq, cfg_.max_position);
  auto st = std::make_unique<EmbeddingState>();
  int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden;
  if (bert_) {
    st->e = Tensor({N, C});
    st->mean = Tensor({N});
    st->rstd = Tensor({N});
  }
  if (cfg_.dropout > 0) {
    st->keep.resize(N * C);
    if (bert_) reserve(d_a_, N * C);
  }
  st->mode = mode;
  st->grads = output_grads(mode, shared_grads_, N, C);
  return st;
}

void EmbeddingBlock::embed_one(int32_t token, int position, float* out) const {
  PF_CHECK(!bert_, "decoding needs a causal LM");
  PF_CHECK(0 <= token && token < cfg_.vocab && 0 <= position && position < cfg_.max_position,
           "token {} at position {}", token, position);
  const float* wpe = llama_ ? nullptr : wpe_.value.data() + int64_t{position} * cfg_.hidden;
  embedding_forward(out, &token, nullptr, wte_.value.data(), wpe, nullptr, 1, 1, cfg_.hidden);
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
    embedding_forward(x_out.data(), mb.tokens.data(), nullptr, wte_.value.data(), llama_ ? nullptr : wpe_.value.data(),
                      nullptr, N, mb.seq, C);
  }
  if (training_ && cfg_.dropout > 0) dropout_forward(x_out.data(), st.keep.data(), N * C, cfg_.dropout, dropout_rng(drop_key_, mb.index));
  return 0.0f;
}

// I: nothing before the embedding waits; it takes the gradient down to the sum of the tables
// (through dropout and, for bert, LayerNorm), which W scatters into them.
void EmbeddingBlock::backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor&, BlockState& bs) {
  auto& st = static_cast<EmbeddingState&>(bs);
  float* de = begin_weight_grads<EmbeddingGrads>(bs).e.data();
  int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  if (!bert_) {  // x_out = Drop(e)
    copy(de, dx_out.data(), N * C);
    if (cfg_.dropout > 0) dropout_backward(de, st.keep.data(), N * C, cfg_.dropout);
    return;
  }
  const float* d = dx_out.data();  // x_out = Drop(LN(e))
  if (cfg_.dropout > 0) {
    PF_CHECK(d_a_.capacity() >= N * C, "embedding backward scratch");
    copy(d_a_.data(), d, N * C);
    dropout_backward(d_a_.data(), st.keep.data(), N * C, cfg_.dropout);
    d = d_a_.data();
  }
  ln_->backward(de, d, st.e.data(), st.mean.data(), st.rstd.data(), N, false);
}

void EmbeddingBlock::backward_weight(const MicroBatch& mb, BlockState& bs) {
  const float* d = end_weight_grads<EmbeddingGrads>(bs, name()).e.data();
  int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden;
  const int32_t* types = mb.token_types.empty() ? nullptr : mb.token_types.data();
  embedding_backward(wte_.grad.data(), llama_ ? nullptr : wpe_.grad.data(), bert_ ? wtt_.grad.data() : nullptr, d,
                     mb.tokens.data(), types, N, mb.seq, C);
}

// ============================================================================ head
namespace {
// out (M, C) = the rows `rows` of x: the head's labelled tokens.
void gather_rows(float* out, const float* x, const int32_t* rows, int64_t M, int64_t C) {
  KernelScope clock(Kernel::elementwise, 8.0 * M * C);
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (M * C > (1 << 16))
  for (int64_t m = 0; m < M; ++m) std::memcpy(out + m * C, x + static_cast<int64_t>(rows[m]) * C, C * sizeof(float));
}

// The rows `rows` of out = x (M, C): the labelled tokens' gradients back in place.
void scatter_rows(float* out, const float* x, const int32_t* rows, int64_t M, int64_t C) {
  KernelScope clock(Kernel::elementwise, 8.0 * M * C);
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (M * C > (1 << 16))
  for (int64_t m = 0; m < M; ++m) std::memcpy(out + static_cast<int64_t>(rows[m]) * C, x + m * C, C * sizeof(float));
}

void zero(float* x, int64_t n) {
  KernelScope clock(Kernel::elementwise, 4.0 * n);
  std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}
}  // namespace

struct HeadState : BlockState {
  std::vector<int32_t> rows, labels;  // the token rows with a label, and their labels
  int64_t M = 0;                      // how many
  Tensor xs;                          // (M, C) gathered input rows
  Tensor t, g;                        // bert: (M, C) transform dense output, after GELU
  Tensor h, mean, rstd;               // (M, C) LayerNorm output (decoder input), (M) statistics
  Tensor loss;                        // (M) token losses
  // From a training forward (the logits exist a chunk of rows at a time, HeadBlock::decoder_pass):
  // the decoder's input gradient and its weight's (and bias's) gradient, added in at W.
  Tensor dh;                          // (M, C)
  Tensor dw, db;                      // (V, C), (V) bert
  bool trained = false;               // dh, dw and db are this forward's (a training forward)
  // BERT next-sentence prediction over the [CLS] rows of the sequences with an NSP label.
  std::vector<int32_t> nsp_rows, nsp_labels;  // (K) sequence index, label
  int64_t K = 0;
  Tensor xc, pooled;                  // (K, C) [CLS] inputs; tanh(pooler) output
  Tensor nsp_logits, nsp_loss;        // (K, 2) logits, then probabilities, then dlogits; (K)
  int64_t bytes() const override {
    const size_t ints = rows.size() + labels.size() + nsp_rows.size() + nsp_labels.size();
    return bytes_of({&xs, &t, &g, &h, &mean, &rstd, &loss, &dh, &dw, &db, &xc, &pooled, &nsp_logits, &nsp_loss}) +
           static_cast<int64_t>(ints * sizeof(int32_t));
  }
};

// The output gradients of the head's Linears that its state does not already hold (the decoder's
// and the NSP classifier's are the dlogits, in place in HeadState), from I to W: bert's (M, C)
// transform and (K, C) pooler.
struct HeadGrads : OutputGrads {
  Tensor t, pooled;
  void fit(int64_t N, int64_t R, int64_t C) {
    reserve(t, N * C);
    reserve(pooled, R * C);
  }
  int64_t bytes() const override { return bytes_of({&t, &pooled}); }
};

HeadBlock::HeadBlock(const ModelConfig& cfg, Param* tied_word)
    : cfg_(cfg), bert_(cfg.arch == Arch::Bert), chunk_rows_(cfg.logit_chunk_rows) {
  const int64_t C = cfg.hidden;
  if (!tied_word && cfg.tie_embeddings) {
    mirror_ = std::make_unique<Param>(word_name(cfg.arch), Shape{cfg.vocab, C});
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
  } else if (cfg.arch == Arch::Gpt) {
    ln_ = std::make_unique<LayerNorm>("transformer.ln_f", C, cfg.layer_norm_eps);
    decoder_ = std::make_unique<Linear>(tied_word, "");
  } else {
    rms_ = std::make_unique<RmsNorm>("model.norm", C, cfg.layer_norm_eps);
    decoder_ = cfg.tie_embeddings ? std::make_unique<Linear>(tied_word, "")
                                  : std::make_unique<Linear>("lm_head.weight", "", C, cfg.vocab);
  }
}

void HeadBlock::norm_forward(float* h, float* mean, float* rstd, const float* x, int64_t rows) const {
  if (rms_) rms_->forward(h, rstd, x, rows);
  else ln_->forward(h, mean, rstd, x, rows);
}

void HeadBlock::norm_backward(float* dx, const float* dh, const float* x, const float* mean, const float* rstd,
                              int64_t rows) {
  if (rms_) rms_->backward(dx, dh, x, rstd, rows, false);
  else ln_->backward(dx, dh, x, mean, rstd, rows, false);
}

std::vector<Param*> HeadBlock::params() {
  std::vector<Param*> ps;
  if (bert_)
    ps = {&transform_->weight(), transform_->bias(), &ln_->weight, &ln_->bias, decoder_->bias(),
          &pooler_->weight(), pooler_->bias(), &nsp_->weight(), nsp_->bias()};
  else if (rms_) ps = {&rms_->weight};
  else ps = {&ln_->weight, &ln_->bias};
  if (mirror_) ps.push_back(mirror_.get());
  if (decoder_->owns_weight()) ps.push_back(&decoder_->weight());  // llama's untied lm_head
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
  if (ln_) init_layernorm(*ln_);
  if (rms_) rms_->weight.value.fill(1.0f);
  if (mirror_) init_normal(*mirror_, seed, cfg_.init_std);  // same name => same values as the owner
  if (decoder_->owns_weight()) init_normal(decoder_->weight(), seed, cfg_.init_std);
}

std::unique_ptr<BlockState> HeadBlock::make_state(int max_rows, int seq, BackwardMode mode) const {
  auto st = std::make_unique<HeadState>();
  const int64_t N = static_cast<int64_t>(max_rows) * seq, C = cfg_.hidden, V = cfg_.vocab;
  st->rows.resize(N);
  st->labels.resize(N);
  for (Tensor* t : {&st->xs, &st->h}) *t = Tensor({N, C});
  if (bert_) st->t = Tensor({N, C}), st->g = Tensor({N, C});
  st->mean = Tensor({N});
  st->rstd = Tensor({N});
  st->loss = Tensor({N});
  st->dh = Tensor({N, C});
  st->dw = Tensor({V, C});
  if (bert_) st->db = Tensor({V});
  // One chunk of logits for every state: the labelled rows (BERT: the masked ones), at most
  // chunk_rows_ of them at a time (model.logit_chunk_rows, or what a test set).
  const int64_t M = static_cast<int64_t>(max_rows) * labelled_per_sequence(cfg_, seq);
  reserve(chunk_, std::min<int64_t>(M, chunk_rows_) * V);
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
  st->mode = mode;
  const int64_t transform_rows = bert_ ? N : 0, pooler_rows = bert_ && cfg_.nsp ? max_rows : 0;
  st->grads = output_grads(mode, shared_grads_, transform_rows, pooler_rows, C);
  return st;
}

float HeadBlock::forward(const MicroBatch& mb, const Tensor& x_in, Tensor&, BlockState& bs) {
  // x_in (N, C) -> loss = loss_scale * sum over labelled tokens of -log softmax(decoder(...))[label]
  KernelScope clock(Kernel::head);
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
  gather_rows(st.xs.data(), x_in.data(), st.rows.data(), M, C);
  const float* hin = st.xs.data();
  if (bert_) {
    transform_->forward(mb.index, st.xs.data(), M, st.t.data());
    gelu_forward(st.g.data(), st.t.data(), M * C, gelu_of(cfg_));
    hin = st.g.data();
  }
  norm_forward(st.h.data(), st.mean.data(), st.rstd.data(), hin, M);
  decoder_pass(mb, st);
  double sum = 0;
  for (int64_t m = 0; m < M; ++m) sum += st.loss[m];
  return static_cast<float>(sum * mb.loss_scale + nsp);
}

// The decoder's logits a chunk of rows at a time, so that the (M, V) logits never exist: each
// chunk's cross-entropy and, while training, its softmax gradient's two products (the decoder's
// input gradient, and its weight gradient summed over the chunks) while the chunk is fresh.
// The state keeps only these; the forward writes nothing outside it, so it can run again.
void HeadBlock::decoder_pass(const MicroBatch& mb, HeadState& st) const {
  const int64_t C = cfg_.hidden, V = cfg_.vocab, M = st.M;
  PF_CHECK(!decoder_->tap(), "head: the decoder is never a K-FAC layer (its logits exist a chunk at a time)");
  PF_CHECK(chunk_rows_ > 0, "head: logit chunks of {} rows", chunk_rows_);
  // A micro-batch labelled more densely than the data's masking (a test's, a caller's) grows it once.
  reserve(chunk_, std::min<int64_t>(M, chunk_rows_) * V);
  st.trained = training_;
  for (int64_t r0 = 0; r0 < M; r0 += chunk_rows_) {
    const int64_t R = std::min(chunk_rows_, M - r0);
    const float* h = st.h.data() + r0 * C;
    const int32_t* labels = st.labels.data() + r0;
    float* z = chunk_.data();
    decoder_->forward(mb.index, h, R, z);
    if (!training_) {
      softmax_cross_entropy_forward(z, st.loss.data() + r0, labels, R, V);
      continue;
    }
    softmax_cross_entropy_with_grad(z, st.loss.data() + r0, labels, R, V, mb.loss_scale);  // z = dlogits
    decoder_->backward_input(mb.index, z, R, st.dh.data() + r0 * C);
    decoder_->weight_gradient_into(z, h, R, st.dw.data(), bert_ ? st.db.data() : nullptr, r0 > 0);
  }
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

void HeadBlock::nsp_backward_input(const MicroBatch& mb, Tensor& dx_in, HeadState& st) {
  const int64_t C = cfg_.hidden, K = st.K;
  if (K == 0) return;
  float *dP = static_cast<HeadGrads&>(*st.grads).pooled.data(), *dB = d_b_.data();
  softmax_cross_entropy_backward(st.nsp_logits.data(), st.nsp_labels.data(), K, 2, mb.nsp_scale);  // dlogits
  nsp_->backward_input(mb.index, st.nsp_logits.data(), K, dP);                                    // dP = dpooled
  for (int64_t i = 0; i < K * C; ++i) dP[i] *= 1.0f - st.pooled[i] * st.pooled[i];               // through tanh
  pooler_->backward_input(mb.index, dP, K, dB);                                                   // dB = dxc
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
  norm_forward(h.data(), mean.data(), rstd.data(), hin, rows);
  decoder_->forward(0, h.data(), rows, out);
}

void HeadBlock::backward_input(const MicroBatch& mb, const Tensor&, Tensor& dx_in, BlockState& bs) {
  KernelScope clock(Kernel::head);
  auto& st = static_cast<HeadState&>(bs);
  float* dT = begin_weight_grads<HeadGrads>(bs).t.data();
  const int64_t N = static_cast<int64_t>(mb.rows) * mb.seq, C = cfg_.hidden, M = st.M;
  check_holds(dx_in, N * C, "head dx_in");
  zero(dx_in.data(), N * C);
  if (M > 0) {
    PF_CHECK(st.trained, "head: a backward after a forward made for evaluation (set_training(false))");
    float *dA = d_a_.data(), *dB = d_b_.data();
    const float* dh = st.dh.data();  // the decoder's input gradient, from the forward
    const float* dxs = dB;
    if (bert_) {
      ln_->backward(dT, dh, st.g.data(), st.mean.data(), st.rstd.data(), M, false);  // dT = dg
      gelu_backward(dT, st.t.data(), dT, M * C, gelu_of(cfg_));                        // dT = dt
      transform_->backward_input(mb.index, dT, M, dA);                                 // dA = dxs
      dxs = dA;
    } else {
      norm_backward(dB, dh, st.xs.data(), st.mean.data(), st.rstd.data(), M);  // dB = dxs
    }
    scatter_rows(dx_in.data(), dxs, st.rows.data(), M, C);
  }
  // The NSP head's gradient adds into the [CLS] rows (after the masked-LM rows are copied in).
  if (bert_ && cfg_.nsp) nsp_backward_input(mb, dx_in, st);
}

// The decoder's weight gradient is the forward's (decoder_pass); the NSP classifier's output
// gradients are the dlogits I left in the state.
void HeadBlock::backward_weight(const MicroBatch&, BlockState& bs) {
  KernelScope clock(Kernel::head);
  auto& st = static_cast<HeadState&>(bs);
  const auto& g = end_weight_grads<HeadGrads>(bs, name());
  if (st.M > 0) {
    add_inplace(decoder_->weight().grad.data(), st.dw.data(), st.dw.numel());
    if (bert_) add_inplace(decoder_->bias()->grad.data(), st.db.data(), st.db.numel());
    if (bert_) transform_->backward_weight(g.t.data(), st.xs.data(), st.M);
  }
  if (bert_ && cfg_.nsp && st.K > 0) {
    nsp_->backward_weight(st.nsp_logits.data(), st.pooled.data(), st.K);
    pooler_->backward_weight(g.pooled.data(), st.xc.data(), st.K);
  }
}

}  // namespace pf
