// Zero-bubble's split backward (nn/block.hpp): I (input gradient) and W (weight gradients) run
// apart, in a zero-bubble order over two micro-batches in flight, give the fused backward's bits;
// the split gradients match finite differences; a W that is not its own state's is refused.
#include "fd.hpp"
#include "nn/model.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

using namespace pf;
using namespace pf::test;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

// BERT with dropout and the NSP head (every head path), GPT with dropout.
ModelConfig config(const std::string& arch) {
  ModelConfig c = tiny_config(arch);
  c.dropout = 0.1f;
  c.nsp = arch == "bert";
  return c;
}

MicroBatch batch(const ModelConfig& c, int index) {
  MicroBatch mb = tiny_batch(c, index, 1 + index);
  if (c.nsp) mb.nsp_labels = {index % 2, 1 - index % 2};
  return mb;
}

// A model cut into two stages, (embedding, block 0) and (block 1, head), two micro-batches in flight.
struct TwoStages {
  std::unique_ptr<Model> a, b;
  ModelState sa[2], sb[2];
  Tensor x[2], dx[2];
  float loss[2] = {};
  TwoStages(const ModelConfig& c, BackwardMode mode) {
    a = build_model(c, 0, 1);
    b = build_model(c, 2, num_blocks(c) - 1);
    for (Model* m : {a.get(), b.get()}) m->init(17), m->set_dropout_step(3, 1);
    for (int k = 0; k < 2; ++k) {
      sa[k] = a->make_state(2, c.seq_len, mode);
      sb[k] = b->make_state(2, c.seq_len, mode);
      x[k] = Tensor({2, c.seq_len, c.hidden});
      dx[k] = Tensor({2, c.seq_len, c.hidden});
    }
  }
  void forward(const MicroBatch* mb) {
    static Tensor none;
    for (int k = 0; k < 2; ++k) {
      a->forward(mb[k], none, x[k], sa[k]);
      loss[k] = b->forward(mb[k], x[k], none, sb[k]);
    }
  }
  std::map<std::string, const Param*> params() {
    std::map<std::string, const Param*> ps;
    for (Model* m : {a.get(), b.get()})
      for (Param* p : m->params()) ps[p->name + (p->mirror ? " (mirror)" : "")] = p;
    return ps;
  }
};

class SplitBackward : public ::testing::TestWithParam<const char*> {};

}  // namespace

// ZB-H1's order on two stages: the last stage's I, the first's I as soon as its dx arrives, W
// later (W of micro-batch 0 after I of micro-batch 1) against B, B, B, B.
TEST_P(SplitBackward, ZeroBubbleOrderEqualsFusedBitForBit) {
  const ModelConfig c = config(GetParam());
  const MicroBatch mb[2] = {batch(c, 0), batch(c, 1)};
  static Tensor none;
  TwoStages fused(c, BackwardMode::fused), split(c, BackwardMode::split);
  fused.forward(mb);
  split.forward(mb);
  for (int k = 0; k < 2; ++k) {
    fused.b->backward(mb[k], none, fused.dx[k], fused.sb[k]);
    fused.a->backward(mb[k], fused.dx[k], none, fused.sa[k]);
  }
  split.b->backward_input(mb[0], none, split.dx[0], split.sb[0]);
  split.a->backward_input(mb[0], split.dx[0], none, split.sa[0]);
  split.b->backward_input(mb[1], none, split.dx[1], split.sb[1]);
  split.b->backward_weight(mb[0], split.sb[0]);
  split.a->backward_input(mb[1], split.dx[1], none, split.sa[1]);
  split.a->backward_weight(mb[0], split.sa[0]);
  split.b->backward_weight(mb[1], split.sb[1]);
  split.a->backward_weight(mb[1], split.sa[1]);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(split.loss[k], fused.loss[k]);
    EXPECT_TRUE(same_bits(split.dx[k], fused.dx[k])) << "input gradient of micro-batch " << k;
  }
  auto split_params = split.params(), fused_params = fused.params();
  ASSERT_EQ(split_params.size(), fused_params.size());
  double total = 0;
  for (auto& [name, p] : split_params) {
    EXPECT_TRUE(same_bits(p->grad, fused_params.at(name)->grad)) << name;
    for (float g : p->grad.span()) total += std::fabs(g);
  }
  EXPECT_GT(total, 0.0);
}

// The whole model, I then W through a split state, against finite differences of its loss.
TEST_P(SplitBackward, InputThenWeightMatchesFiniteDifferences) {
  ModelConfig c = config(GetParam());
  c.dropout = 0;  // the finite differences re-run forwards; without dropout they see one function
  auto m = build_model(c, 0, num_blocks(c) - 1);
  m->init(17);
  const MicroBatch mb = batch(c, 0);
  ModelState st = m->make_state(mb.rows, mb.seq, BackwardMode::split);
  Tensor none;
  auto loss = [&] { return double(m->forward(mb, none, none, st)); };
  loss();
  m->backward_input(mb, none, none, st);
  m->backward_weight(mb, st);
  for (Param* p : m->params())
    check_grad(p->name, p->value.data(), p->grad.data(), p->value.numel(), loss, {.floor = 3e-4, .samples = 12});
}

// States made fused share their block's output gradients: a W after another state's I would read
// that micro-batch's, so it is refused; split states each keep their own, held from I until W.
TEST_P(SplitBackward, FusedStatesRefuseADeferredWeightGradient) {
  const ModelConfig c = config(GetParam());
  const MicroBatch mb[2] = {batch(c, 0), batch(c, 1)};
  for (BackwardMode mode : {BackwardMode::fused, BackwardMode::split}) {
    TwoStages t(c, mode);
    t.forward(mb);
    t.b->backward_input(mb[0], Tensor(), t.dx[0], t.sb[0]);
    t.b->backward_input(mb[1], Tensor(), t.dx[1], t.sb[1]);
    if (mode == BackwardMode::fused) {
      EXPECT_THROW(t.b->backward_weight(mb[0], t.sb[0]), std::logic_error);
      EXPECT_EQ(t.sb[0].deferred_bytes(), 0);
    } else {
      EXPECT_NO_THROW(t.b->backward_weight(mb[0], t.sb[0]));
      EXPECT_THROW(t.b->backward_weight(mb[0], t.sb[0]), std::logic_error);  // twice: no I before it
      EXPECT_GT(t.sb[0].deferred_bytes(), 0);
    }
  }
}

// What I keeps for W, per transformer block: the output gradients of its Linears, N (3C + C + F + C) floats.
TEST(SplitBackwardMemory, TransformerBlockKeepsItsLinearsOutputGradients) {
  for (const char* arch : {"bert", "gpt"}) {
    const ModelConfig c = tiny_config(arch);
    TransformerBlock blk(c, 0);
    const int64_t N = 2 * c.seq_len, C = c.hidden, F = c.ffn;
    EXPECT_EQ(blk.make_state(2, c.seq_len, BackwardMode::split)->deferred_bytes(), N * (5 * C + F) * 4) << arch;
    EXPECT_EQ(blk.make_state(2, c.seq_len, BackwardMode::fused)->deferred_bytes(), 0) << arch;
  }
}

// Llama: q (C), k and v (KV each), o (C), gate and up (F each), down (C): N (3C + 2KV + 2F) floats.
TEST(SplitBackwardMemory, LlamaBlockKeepsItsLinearsOutputGradients) {
  const ModelConfig c = tiny_config("llama");
  LlamaBlock blk(c, 0);
  const int64_t N = 2 * c.seq_len, C = c.hidden, F = c.ffn, KV = kv_width(c);
  EXPECT_EQ(KV, C / 2);
  EXPECT_EQ(blk.make_state(2, c.seq_len, BackwardMode::split)->deferred_bytes(), N * (3 * C + 2 * KV + 2 * F) * 4);
  EXPECT_EQ(blk.make_state(2, c.seq_len, BackwardMode::fused)->deferred_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(Arch, SplitBackward, ::testing::Values("bert", "gpt", "llama"));
