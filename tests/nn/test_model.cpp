// Whole-model gradients, determinism, cutting into stages, micro-batches in flight, no allocation.
#include "core/blas.hpp"
#include "fd.hpp"
#include "nn/model.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <new>

using namespace pf;
using namespace pf::test;

// Counts C++ heap allocations while `counting` is set (this test program only).
static std::atomic<bool> counting{false};
static std::atomic<long> allocations{0};
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// A replaced operator new that mallocs is freed with free: GCC sees new/free and warns anyway.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

std::unique_ptr<Model> full_model(const ModelConfig& c, uint64_t seed = 17) {
  auto m = build_model(c, 0, num_blocks(c) - 1);
  m->init(seed);
  return m;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

class ModelTest : public ::testing::TestWithParam<const char*> {};

}  // namespace

static void expect_whole_model_gradients(const ModelConfig& c) {
  auto m = full_model(c);
  MicroBatch mb = tiny_batch(c);
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  auto loss = [&] { return double(m->forward(mb, none, none, st)); };
  double l0 = loss();
  EXPECT_GT(l0, 0.0);
  m->backward(mb, none, none, st);
  for (Param* p : m->params())
    check_grad(p->name, p->value.data(), p->grad.data(), p->value.numel(), loss, {.floor = 3e-4, .samples = 12});
  // The tied word matrix appears once, shared by the embedding and the decoder.
  int n = 0;
  for (Param* p : m->params()) n += p->name == word_name(c.arch);
  EXPECT_EQ(n, 1);
}

TEST_P(ModelTest, WholeModelGradientsMatchFiniteDifferences) { expect_whole_model_gradients(tiny_config(GetParam())); }

// Llama's own lm_head: its gradient and the embedding's, apart.
TEST(Model, LlamaUntiedGradientsMatchFiniteDifferences) {
  ModelConfig c = tiny_config("llama");
  c.tie_embeddings = false;
  expect_whole_model_gradients(c);
}

TEST_P(ModelTest, SameSeedSameBits) {
  ModelConfig c = tiny_config(GetParam());
  c.dropout = 0.1f;
  float losses[2];
  std::vector<Tensor> grads[2];
  for (int run = 0; run < 2; ++run) {
    auto m = full_model(c);
    m->set_dropout_step(5, 1);
    MicroBatch mb = tiny_batch(c);
    ModelState st = m->make_state(mb.rows, mb.seq);
    Tensor none;
    losses[run] = m->forward(mb, none, none, st);
    m->backward(mb, none, none, st);
    for (Param* p : m->params()) grads[run].push_back(p->grad);
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << i;
}

// Blocks 0..k and k+1..end, passing x forward and dx backward, against the whole model.
TEST_P(ModelTest, CutIntoTwoRangesGivesTheSameLossAndGradients) {
  ModelConfig c = tiny_config(GetParam());
  const int last = num_blocks(c) - 1;
  MicroBatch mb = tiny_batch(c);
  Tensor none;
  auto full = full_model(c);
  ModelState fs = full->make_state(mb.rows, mb.seq);
  float full_loss = full->forward(mb, none, none, fs);
  full->backward(mb, none, none, fs);
  std::map<std::string, Param*> ref;
  for (Param* p : full->params()) ref[p->name] = p;
  const std::string word = word_name(c.arch);
  for (int k = 0; k < last; ++k) {
    auto a = build_model(c, 0, k), b = build_model(c, k + 1, last);
    a->init(17);
    b->init(17);
    ModelState sa = a->make_state(mb.rows, mb.seq), sb = b->make_state(mb.rows, mb.seq);
    Tensor x({mb.rows, mb.seq, c.hidden}), dx({mb.rows, mb.seq, c.hidden});
    a->forward(mb, none, x, sa);
    float loss = b->forward(mb, x, none, sb);
    b->backward(mb, none, dx, sb);
    a->backward(mb, dx, none, sa);
    EXPECT_EQ(loss, full_loss) << "cut after block " << k;
    Param* owner = nullptr;
    Param* mirror = nullptr;
    for (auto* m : {a.get(), b.get()})
      for (Param* p : m->params()) {
        ASSERT_TRUE(ref.count(p->name)) << p->name;
        EXPECT_TRUE(same_bits(p->value, ref[p->name]->value)) << "init of " << p->name << " depends on the cut";
        if (p->name == word) (p->mirror ? mirror : owner) = p;
        else EXPECT_TRUE(same_bits(p->grad, ref[p->name]->grad)) << p->name << " cut after block " << k;
      }
    // The tied matrix: the owner gets the embedding's part and the mirror the decoder's; their sum
    // is the full model's gradient up to the order of the additions.
    ASSERT_NE(owner, nullptr);
    ASSERT_NE(mirror, nullptr);
    EXPECT_FALSE(owner->mirror);
    for (int64_t i = 0; i < owner->grad.numel(); ++i)
      ASSERT_NEAR(owner->grad[i] + mirror->grad[i], ref[word]->grad[i], 1e-6f * (1 + std::abs(ref[word]->grad[i])));
  }
}

// forward mb0, forward mb1, backward mb1, backward mb0 with two states == one at a time.
TEST_P(ModelTest, MicroBatchesInFlightAreIndependent) {
  ModelConfig c = tiny_config(GetParam());
  MicroBatch mb0 = tiny_batch(c, 0, 1), mb1 = tiny_batch(c, 1, 2);
  Tensor none;
  auto interleaved = full_model(c), sequential = full_model(c), natural = full_model(c);
  ModelState s0 = interleaved->make_state(2, c.seq_len), s1 = interleaved->make_state(2, c.seq_len);
  float l0 = interleaved->forward(mb0, none, none, s0);
  float l1 = interleaved->forward(mb1, none, none, s1);
  interleaved->backward(mb1, none, none, s1);
  interleaved->backward(mb0, none, none, s0);
  // Same order of gradient accumulation, one state, one micro-batch at a time: bitwise equal.
  ModelState s = sequential->make_state(2, c.seq_len);
  EXPECT_EQ(sequential->forward(mb1, none, none, s), l1);
  sequential->backward(mb1, none, none, s);
  EXPECT_EQ(sequential->forward(mb0, none, none, s), l0);
  sequential->backward(mb0, none, none, s);
  // The natural order (0 then 1) differs only by the order of additions.
  ModelState n = natural->make_state(2, c.seq_len);
  natural->forward(mb0, none, none, n);
  natural->backward(mb0, none, none, n);
  natural->forward(mb1, none, none, n);
  natural->backward(mb1, none, none, n);
  auto pi = interleaved->params(), ps = sequential->params(), pn = natural->params();
  for (size_t i = 0; i < pi.size(); ++i) {
    EXPECT_TRUE(same_bits(pi[i]->grad, ps[i]->grad)) << pi[i]->name;
    for (int64_t j = 0; j < pi[i]->grad.numel(); ++j)
      ASSERT_NEAR(pi[i]->grad[j], pn[i]->grad[j], 1e-6f * (1 + std::abs(pn[i]->grad[j]))) << pi[i]->name;
  }
}

TEST_P(ModelTest, SteadyStateStepMakesNoHeapAllocation) {
  ModelConfig c = tiny_config(GetParam());
  c.dropout = 0.1f;
  auto m = full_model(c);
  MicroBatch mb = tiny_batch(c);
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  for (int t : {1, 2}) {
    set_threads(t);
    m->forward(mb, none, none, st);  // warm-up: thread pools, first-touch
    m->backward(mb, none, none, st);
    allocations = 0;
    counting = true;
    for (int step = 0; step < 3; ++step) {
      m->set_dropout_step(1, step);
      m->forward(mb, none, none, st);
      m->backward(mb, none, none, st);
    }
    counting = false;
    EXPECT_EQ(allocations.load(), 0) << t << " threads";
  }
  // Nor does the split backward (I, then W), each state with its own output gradients.
  ModelState split = m->make_state(mb.rows, mb.seq, BackwardMode::split);
  m->forward(mb, none, none, split);
  m->backward_input(mb, none, none, split);
  m->backward_weight(mb, split);
  allocations = 0;
  counting = true;
  for (int step = 0; step < 3; ++step) {
    m->set_dropout_step(1, step);
    m->forward(mb, none, none, split);
    m->backward_input(mb, none, none, split);
    m->backward_weight(mb, split);
  }
  counting = false;
  EXPECT_EQ(allocations.load(), 0) << "split backward";
  // The counter does count: building a state allocates.
  counting = true;
  ModelState other = m->make_state(1, c.seq_len);
  counting = false;
  EXPECT_GT(allocations.load(), 0);
}

// The head keeps logits for the rows with a label only: every token of GPT's, BERT's masked
// ones (round(0.15 x 14) = 2 of a 16-token sequence). Only the logits grow with the vocabulary,
// so a state's bytes grow by 4 x rows x labelled per extra word.
TEST_P(ModelTest, HeadStateHoldsNoLogits) {
  // A state grows with the vocabulary by the decoder's weight gradient (and BERT's bias's) alone,
  // whatever its rows: the logits exist in the head's one chunk, not in a state.
  ModelConfig c = tiny_config(GetParam());
  c.seq_len = 16;
  c.mask_prob = 0.15f;
  ModelConfig wide = c;
  wide.vocab = c.vocab + 100;
  const int64_t gradient = 4 * 100 * (c.hidden + (c.arch == Arch::Bert ? 1 : 0));
  for (int rows : {3, 6}) {
    const int64_t grown = full_model(wide)->make_state(rows, c.seq_len).activation_bytes() -
                          full_model(c)->make_state(rows, c.seq_len).activation_bytes();
    EXPECT_EQ(grown, gradient) << rows << " rows";
  }
}

// BERT only: GPT batches are unpadded windows (its causality is tested below).
TEST(Model, BertPaddingTokensDoNotChangeTheLoss) {
  ModelConfig c = tiny_config("bert");
  auto m = full_model(c);
  MicroBatch mb = tiny_batch(c);
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  float l = m->forward(mb, none, none, st);
  const int n = mb.rows * mb.seq;
  mb.tokens[n - 1] = (mb.tokens[n - 1] + 7) % c.vocab;  // a padding position (mask 0, no label)
  EXPECT_EQ(m->forward(mb, none, none, st), l);
  mb.tokens[0] = (mb.tokens[0] + 7) % c.vocab;  // a real token
  EXPECT_NE(m->forward(mb, none, none, st), l);
}

TEST_P(ModelTest, EvaluationRunsWithoutDropout) {
  ModelConfig plain = tiny_config(GetParam()), dropped = plain;
  dropped.dropout = 0.3f;
  auto a = full_model(plain), b = full_model(dropped);
  MicroBatch mb = tiny_batch(plain);
  ModelState sa = a->make_state(mb.rows, mb.seq), sb = b->make_state(mb.rows, mb.seq);
  Tensor none;
  const float reference = a->forward(mb, none, none, sa);
  EXPECT_NE(b->forward(mb, none, none, sb), reference);  // training: dropout applies
  b->set_training(false);
  EXPECT_EQ(b->forward(mb, none, none, sb), reference);  // evaluation: the same bits as no dropout
  b->set_training(true);
  EXPECT_NE(b->forward(mb, none, none, sb), reference);
}

TEST(Model, GptAndLlamaAreCausal) {
  // Changing the last token changes only the last position's loss: remove it from the labels and
  // the loss must be unchanged.
  for (const char* arch : {"gpt", "llama"}) {
  SCOPED_TRACE(arch);
  ModelConfig c = tiny_config(arch);
  auto m = full_model(c);
  MicroBatch mb = tiny_batch(c);
  mb.labels[c.seq_len - 1] = -1;
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  float l = m->forward(mb, none, none, st);
  mb.tokens[c.seq_len - 1] = (mb.tokens[c.seq_len - 1] + 3) % c.vocab;
  EXPECT_EQ(m->forward(mb, none, none, st), l);
  mb.tokens[c.seq_len - 2] = (mb.tokens[c.seq_len - 2] + 3) % c.vocab;
  EXPECT_NE(m->forward(mb, none, none, st), l);
  }
}

TEST(Model, HuggingFaceNamesAndLinears) {
  ModelConfig b = tiny_config("bert"), g = tiny_config("gpt");
  auto mb = full_model(b), mg = full_model(g);
  for (const char* n : {"bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.bias",
                        "bert.encoder.layer.1.attention.self.value.weight", "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                        "bert.encoder.layer.1.intermediate.dense.bias", "bert.encoder.layer.1.output.LayerNorm.weight",
                        "cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.bias",
                        "cls.predictions.bias"})
    EXPECT_NE(mb->find_param(n), nullptr) << n;
  for (const char* n : {"transformer.wpe.weight", "transformer.h.1.ln_1.weight", "transformer.h.0.attn.c_attn.bias",
                        "transformer.h.1.mlp.c_proj.weight", "transformer.ln_f.bias"})
    EXPECT_NE(mg->find_param(n), nullptr) << n;
  Param* qkv = mg->find_param("transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_TRUE(qkv->hf_transposed);
  EXPECT_EQ(qkv->value.shape(), (Shape{3 * g.hidden, g.hidden}));  // [out, in] in memory
  EXPECT_FALSE(mb->find_param("bert.embeddings.LayerNorm.weight")->decay);
  EXPECT_FALSE(mb->find_param("bert.encoder.layer.0.output.dense.bias")->decay);
  EXPECT_TRUE(mb->find_param("bert.encoder.layer.0.output.dense.weight")->decay);
  EXPECT_EQ(mb->linears().size(), 2u * 6 + 2);  // q, k, v, o, inter, out per layer; transform, decoder
  // Param::linear (what optim.name = soap rotates): a Linear's own weight, not the tied word
  // embedding the decoder uses, nor a bias.
  for (Linear* l : mb->linears()) EXPECT_EQ(l->weight().linear, l->owns_weight()) << l->name();
  EXPECT_FALSE(mb->find_param("bert.embeddings.word_embeddings.weight")->linear);
  EXPECT_FALSE(mb->find_param("bert.encoder.layer.0.output.dense.bias")->linear);
  EXPECT_TRUE(mg->find_param("transformer.h.0.attn.c_attn.weight")->linear);
  EXPECT_FALSE(mg->find_param("transformer.wpe.weight")->linear);
  EXPECT_EQ(mg->linears().size(), 2u * 4 + 1);
  EXPECT_EQ(mb->linears()[0]->name(), "bert.encoder.layer.0.attention.self.query.weight");
  // GPT-2's residual projections start smaller (std / sqrt(2 layers)).
  double s1 = 0, s2 = 0;
  for (float v : mg->find_param("transformer.h.0.mlp.c_fc.weight")->value.span()) s1 += v * v;
  for (float v : mg->find_param("transformer.h.0.mlp.c_proj.weight")->value.span()) s2 += v * v;
  EXPECT_NEAR(std::sqrt(s2 / s1), 0.5, 0.1);
}

// LlamaForCausalLM's names and shapes: no biases, k and v of the key/value heads' width, an own
// lm_head when untied (and none when tied: the head is the word embedding, as in GPT).
TEST(Model, LlamaNamesShapesAndLinears) {
  ModelConfig c = tiny_config("llama");
  c.heads = 4, c.kv_heads = 2, c.tie_embeddings = false;
  auto m = full_model(c);
  const int64_t C = c.hidden, KV = 2 * (C / 4);
  auto shape = [&](const char* n) {
    Param* p = m->find_param(n);
    EXPECT_NE(p, nullptr) << n;
    return p ? p->value.shape() : Shape{};
  };
  EXPECT_EQ(shape("model.embed_tokens.weight"), (Shape{c.vocab, C}));
  EXPECT_EQ(shape("model.layers.1.input_layernorm.weight"), (Shape{C}));
  EXPECT_EQ(shape("model.layers.1.self_attn.q_proj.weight"), (Shape{C, C}));
  EXPECT_EQ(shape("model.layers.1.self_attn.k_proj.weight"), (Shape{KV, C}));
  EXPECT_EQ(shape("model.layers.0.self_attn.v_proj.weight"), (Shape{KV, C}));
  EXPECT_EQ(shape("model.layers.0.post_attention_layernorm.weight"), (Shape{C}));
  EXPECT_EQ(shape("model.layers.0.mlp.gate_proj.weight"), (Shape{c.ffn, C}));
  EXPECT_EQ(shape("model.layers.0.mlp.down_proj.weight"), (Shape{C, c.ffn}));
  EXPECT_EQ(shape("model.norm.weight"), (Shape{C}));
  EXPECT_EQ(shape("lm_head.weight"), (Shape{c.vocab, C}));
  for (const Param* p : m->params()) EXPECT_EQ(p->name.find("bias"), std::string::npos) << p->name;
  EXPECT_EQ(m->linears().size(), 2u * 7 + 1);  // q, k, v, o, gate, up, down per layer; lm_head
  EXPECT_EQ(m->linears()[4]->name(), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(parameter_count(*m), 2 * c.vocab * C + C +
                                     c.layers * (2 * C * C + 2 * C * KV + 3 * C * c.ffn + 2 * C));
  c.tie_embeddings = true;
  auto tied = full_model(c);
  EXPECT_EQ(tied->find_param("lm_head.weight"), nullptr);
  EXPECT_EQ(parameter_count(*tied), parameter_count(*m) - c.vocab * C);
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelTest, ::testing::Values("bert", "gpt", "llama"));

TEST(Model, RefusesTokensOutsideTheVocabulary) {
  ModelConfig c = tiny_config("bert");
  auto m = full_model(c);
  MicroBatch mb = tiny_batch(c);
  mb.tokens[3] = c.vocab;
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  EXPECT_THROW(m->forward(mb, none, none, st), std::logic_error);
}

namespace {
// BERT with next-sentence prediction on: both sequences labelled (one "next", one "random").
MicroBatch nsp_batch(const ModelConfig& c) {
  MicroBatch mb = tiny_batch(c);
  mb.loss_scale = 0.25f;
  mb.nsp_labels = {0, 1};
  mb.nsp_scale = 0.5f;
  return mb;
}
}  // namespace

// The pooler and the NSP classifier (and, through the [CLS] rows, everything below them) against
// finite differences of the whole model's loss.
TEST(Model, BertNspHeadGradientsMatchFiniteDifferences) {
  ModelConfig c = tiny_config("bert");
  c.nsp = true;
  auto m = full_model(c);
  MicroBatch mb = nsp_batch(c);
  ModelState st = m->make_state(mb.rows, mb.seq);
  Tensor none;
  auto loss = [&] { return double(m->forward(mb, none, none, st)); };
  loss();
  m->backward(mb, none, none, st);
  for (const char* n : {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                        "cls.seq_relationship.bias"}) {
    Param* p = m->find_param(n);
    ASSERT_NE(p, nullptr) << n;
    double g = 0;
    for (float v : p->grad.span()) g += std::fabs(v);
    EXPECT_GT(g, 1e-3) << n;  // the NSP loss reaches it
  }
  for (Param* p : m->params())
    check_grad(p->name, p->value.data(), p->grad.data(), p->value.numel(), loss, {.floor = 3e-4, .samples = 12});
}

// The NSP part of the loss, computed independently in double from the encoder's [CLS] outputs
// and the head's weights: nsp_scale x sum of -log softmax(W_s tanh(W_p x + b_p) + b_s)[label].
// Without data.nsp the same model (same seed: the same weights) gives the masked-LM loss alone.
TEST(Model, BertNspLossIsMaskedLmPlusPairClassification) {
  ModelConfig c = tiny_config("bert");
  c.nsp = true;
  auto m = full_model(c);
  ModelConfig plain_cfg = c;
  plain_cfg.nsp = false;
  auto plain = full_model(plain_cfg);
  auto encoder = build_model(c, 0, c.layers);  // embedding + blocks: the head's input
  encoder->init(17);
  MicroBatch mb = nsp_batch(c);
  Tensor none, x({int64_t(mb.rows) * mb.seq, c.hidden}), unused;
  ModelState st = m->make_state(mb.rows, mb.seq), sp = plain->make_state(mb.rows, mb.seq),
             se = encoder->make_state(mb.rows, mb.seq);
  const double total = m->forward(mb, none, unused, st), mlm = plain->forward(mb, none, unused, sp);
  encoder->forward(mb, none, x, se);
  const int64_t C = c.hidden;
  const Tensor &wp = m->find_param("bert.pooler.dense.weight")->value, &bp = m->find_param("bert.pooler.dense.bias")->value;
  const Tensor &ws = m->find_param("cls.seq_relationship.weight")->value,
               &bs = m->find_param("cls.seq_relationship.bias")->value;
  double nsp = 0;
  for (int r = 0; r < mb.rows; ++r) {
    const float* xc = x.data() + int64_t(r) * mb.seq * C;
    std::vector<double> pooled(C);
    for (int64_t o = 0; o < C; ++o) {
      double s = bp[o];
      for (int64_t i = 0; i < C; ++i) s += double(wp[o * C + i]) * xc[i];
      pooled[o] = std::tanh(s);
    }
    double z[2];
    for (int k = 0; k < 2; ++k) {
      z[k] = bs[k];
      for (int64_t i = 0; i < C; ++i) z[k] += double(ws[k * C + i]) * pooled[i];
    }
    const double lse = std::max(z[0], z[1]) + std::log(std::exp(z[0] - std::max(z[0], z[1])) + std::exp(z[1] - std::max(z[0], z[1])));
    nsp += lse - z[mb.nsp_labels[r]];
  }
  nsp *= mb.nsp_scale;
  EXPECT_GT(nsp, 0.1);
  EXPECT_NEAR(total, mlm + nsp, 1e-5 * (std::fabs(total) + 1));
  // Without data.nsp the head still has (and saves) the pooler and NSP classifier, not for K-FAC,
  // and without weight decay (nothing trains them).
  EXPECT_NE(plain->find_param("cls.seq_relationship.weight"), nullptr);
  EXPECT_FALSE(plain->find_param("bert.pooler.dense.weight")->decay);
  EXPECT_TRUE(m->find_param("bert.pooler.dense.weight")->decay);
  EXPECT_EQ(plain->linears().size() + 2, m->linears().size());
  EXPECT_EQ(m->linears().back()->name(), "cls.seq_relationship.weight");
}

// The KV cache's decode gives the logits of a full forward of the same tokens at every position,
// to float32 rounding: the same operations, row products instead of matrix products. Bound: 64
// units of float32 rounding (2^-24 each) per unit of the logits' scale, for sums of at most
// 32 products through two blocks.
TEST(Model, KvCacheDecodeGivesTheFullForwardsLogits) {
  for (const char* arch : {"gpt", "llama"}) {
  SCOPED_TRACE(arch);
  ModelConfig c = tiny_config(arch);
  c.seq_len = 12;
  auto m = build_model(c, 0, num_blocks(c) - 1);
  m->init(3);
  m->set_training(false);
  std::vector<int32_t> tokens(static_cast<size_t>(c.seq_len));
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<int32_t>((7 * t + 3) % static_cast<size_t>(c.vocab));
  KvCache cache = m->make_kv_cache(c.seq_len);
  ModelState st = m->make_state(1, c.seq_len);
  MicroBatch mb;
  std::vector<float> cached(static_cast<size_t>(c.vocab)), full(cached.size());
  double worst = 0;
  for (int t = 0; t < c.seq_len; ++t) {
    m->decode(tokens[static_cast<size_t>(t)], cache, cached.data());
    mb.resize(1, t + 1);
    std::copy(tokens.begin(), tokens.begin() + t + 1, mb.tokens.begin());
    std::fill(mb.token_types.begin(), mb.token_types.end(), 0);
    std::fill(mb.attn_mask.begin(), mb.attn_mask.end(), 1);
    std::fill(mb.labels.begin(), mb.labels.end(), -1);
    m->logits(mb, st, 0, t, full.data());
    double scale = 0;
    for (float x : full) scale = std::max(scale, static_cast<double>(std::abs(x)));
    for (size_t i = 0; i < full.size(); ++i) {
      const double err = std::abs(static_cast<double>(cached[i]) - full[i]) / (1 + scale);
      worst = std::max(worst, err);
      EXPECT_LE(err, 64 * 0x1p-24) << "position " << t << ", logit " << i << ": " << cached[i] << " vs " << full[i];
    }
  }
  EXPECT_EQ(cache.length, c.seq_len);
  RecordProperty(std::string("worst_relative_difference_") + arch, std::to_string(worst));
  }
}
