// Every layer's backward against central finite differences of its float forward, in double.
#include "fd.hpp"
#include "nn/blocks.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace pf;
using namespace pf::test;

namespace {
struct RecordingTap : LinearTap {
  std::vector<float> x, g;
  int64_t xrows = 0, grows = 0;
  int mb_x = -1, mb_g = -1;
  void on_input(const Linear&, int mb, const float* p, int64_t rows, int64_t cols) override {
    x.assign(p, p + rows * cols), xrows = rows, mb_x = mb;
  }
  void on_grad_output(const Linear&, int mb, const float* p, int64_t rows, int64_t cols) override {
    g.assign(p, p + rows * cols), grows = rows, mb_g = mb;
  }
};
}  // namespace

TEST(Layers, LinearGradientsAndTap) {
  const int64_t rows = 6, in = 7, out = 5;
  Linear lin("l.weight", "l.bias", in, out);
  fill_normal(lin.weight().value.data(), in * out, 1);
  fill_normal(lin.bias()->value.data(), out, 2);
  Tensor x = randn({rows, in}, 3), R = randn({rows, out}, 4), y({rows, out}), dx({rows, in});
  auto loss = [&] {
    lin.forward(0, x.data(), rows, y.data());
    return dot(y.data(), R.data(), y.numel());
  };
  // Forward against the definition y = x W^T + b.
  loss();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = lin.bias()->value[o];
      for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * lin.weight().value[o * in + i];
      EXPECT_NEAR(y[r * out + o], s, 1e-5);
    }
  RecordingTap tap;
  lin.set_tap(&tap);
  loss();
  lin.backward_input(3, R.data(), rows, dx.data());  // I: the tap sees the output gradient here
  lin.set_tap(nullptr);
  lin.backward_weight(R.data(), x.data(), rows);     // W
  check_grad("dx", x.data(), dx.data(), x.numel(), loss);
  check_grad("dW", lin.weight().value.data(), lin.weight().grad.data(), in * out, loss);
  check_grad("db", lin.bias()->value.data(), lin.bias()->grad.data(), out, loss);
  // The tap saw exactly the input and the output gradient, with the micro-batch index.
  EXPECT_EQ(tap.xrows, rows);
  EXPECT_EQ(tap.grows, rows);
  EXPECT_EQ(tap.mb_g, 3);
  EXPECT_TRUE(std::equal(tap.x.begin(), tap.x.end(), x.data()));
  EXPECT_TRUE(std::equal(tap.g.begin(), tap.g.end(), R.data()));
  EXPECT_EQ(lin.name(), "l.weight");
}

TEST(Layers, LayerNormGradients) {
  const int64_t rows = 5, C = 12;
  LayerNorm ln("ln", C, 1e-5f);
  fill_normal(ln.weight.value.data(), C, 1);
  fill_normal(ln.bias.value.data(), C, 2);
  Tensor x = randn({rows, C}, 3, 2.0f), R = randn({rows, C}, 4), y({rows, C}), mean({rows}), rstd({rows}),
         dx({rows, C});
  auto loss = [&] {
    ln.forward(y.data(), mean.data(), rstd.data(), x.data(), rows);
    return dot(y.data(), R.data(), y.numel());
  };
  loss();
  ln.backward(dx.data(), R.data(), x.data(), mean.data(), rstd.data(), rows, false);
  check_grad("dx", x.data(), dx.data(), x.numel(), loss);
  check_grad("dweight", ln.weight.value.data(), ln.weight.grad.data(), C, loss);
  check_grad("dbias", ln.bias.value.data(), ln.bias.grad.data(), C, loss);
}

TEST(Layers, GeluGradientsBothForms) {
  const int64_t n = 64;
  for (Gelu kind : {Gelu::Erf, Gelu::Tanh}) {
    Tensor x = randn({n}, 5, 2.0f), R = randn({n}, 6), y({n}), dx({n});
    auto loss = [&] {
      gelu_forward(y.data(), x.data(), n, kind);
      return dot(y.data(), R.data(), n);
    };
    gelu_backward(dx.data(), x.data(), R.data(), n, kind);
    check_grad(kind == Gelu::Erf ? "gelu erf" : "gelu tanh", x.data(), dx.data(), n, loss, {.eps = 1e-3f, .samples = 64});
  }
}

// Attention between the projections: q, k, v in one (B, T, ld) layout each.
static void attention_case(bool causal, bool fused) {
  const int64_t B = 2, T = 5, H = 2, D = 3, C = H * D, N = B * T;
  const int64_t ld = fused ? 3 * C : C;
  Tensor qkv = randn({3, N, C}, 7);  // separate buffers, or one fused (N, 3C) buffer below
  Tensor fusedbuf({N, 3 * C});
  float *q, *k, *v;
  if (fused) {
    for (int64_t n = 0; n < N; ++n)
      for (int p = 0; p < 3; ++p) std::memcpy(&fusedbuf[n * 3 * C + p * C], &qkv[(p * N + n) * C], C * sizeof(float));
    q = fusedbuf.data(), k = q + C, v = q + 2 * C;
  } else {
    q = qkv.data(), k = q + N * C, v = k + N * C;
  }
  std::vector<uint8_t> mask(N, 1);
  mask[N - 1] = mask[N - 2] = 0;  // the second sequence's last two tokens are padding
  const uint8_t* km = causal ? nullptr : mask.data();
  Tensor out({N, C}), probs({B, H, T, T}), R = randn({N, C}, 8);
  auto loss = [&] {
    attention_forward(out.data(), probs.data(), q, k, v, ld, B, T, H, D, causal, km);
    return dot(out.data(), R.data(), out.numel());
  };
  loss();
  // Forward against a direct double computation; masked probabilities exactly 0.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(T, -INFINITY);
        double m = -INFINITY, z = 0;
        for (int64_t j = 0; j < T; ++j) {
          if ((causal && j > i) || (km && !km[b * T + j])) continue;
          s[j] = 0;
          for (int64_t d = 0; d < D; ++d) s[j] += double(q[(b * T + i) * ld + h * D + d]) * k[(b * T + j) * ld + h * D + d];
          s[j] /= std::sqrt(double(D));
          m = std::max(m, s[j]);
        }
        for (int64_t j = 0; j < T; ++j) z += std::exp(s[j] - m);
        for (int64_t j = 0; j < T; ++j) {
          double p = std::exp(s[j] - m) / z;
          float got = probs[((b * H + h) * T + i) * T + j];
          if (std::isinf(s[j])) EXPECT_EQ(got, 0.0f);
          else EXPECT_NEAR(got, p, 1e-6);
        }
      }
  Tensor dbuf({3, N, 3 * C});
  float *dq = dbuf.data(), *dk = dq + (fused ? C : N * C), *dv = dq + (fused ? 2 * C : 2 * N * C);
  Tensor scratch({attention_scratch_floats(T, 64)});
  attention_backward(dq, dk, dv, ld, scratch.data(), scratch.numel(), R.data(), probs.data(), q, k, v, ld, B, T, H, D);
  // Compare on the strided layout: pack the gradients of the N x C entries actually used.
  for (auto [name, val, grad] : {std::tuple{"dq", q, dq}, std::tuple{"dk", k, dk}, std::tuple{"dv", v, dv}}) {
    for (int64_t n = 0; n < N; n += 3)
      check_grad(std::string(name) + " row " + std::to_string(n), val + n * ld, grad + n * ld, C, loss,
                 {.samples = int(C)});
  }
}

TEST(Layers, AttentionBidirectionalWithPaddingMask) { attention_case(false, false); }
TEST(Layers, AttentionCausalFusedQkv) { attention_case(true, true); }

// A block as a function of its input and parameters: loss = <out, R>.
template <class BlockT>
static void check_block(BlockT& blk, const MicroBatch& mb, const ModelConfig& c, bool check_input, Tol tol = {}) {
  const int64_t N = int64_t(mb.rows) * mb.seq, C = c.hidden;
  auto st = blk.make_state(mb.rows, mb.seq, BackwardMode::fused);
  Tensor x = randn({mb.rows, mb.seq, C}, 11), y({mb.rows, mb.seq, C}), R = randn({mb.rows, mb.seq, C}, 12);
  Tensor dx({mb.rows, mb.seq, C});
  auto loss = [&] {
    double l = blk.forward(mb, x, y, *st);
    return l + dot(y.data(), R.data(), N * C);  // the head returns its loss and writes no y
  };
  loss();
  blk.backward(mb, R, dx, *st);
  if (check_input) check_grad(blk.name() + " dx_in", x.data(), dx.data(), N * C, loss, tol);
  for (Param* p : blk.params()) check_grad(p->name, p->value.data(), p->grad.data(), p->value.numel(), loss, tol);
}

TEST(Layers, EmbeddingGradientsBertGptAndLlama) {
  for (const char* arch : {"bert", "gpt", "llama"}) {
    ModelConfig c = tiny_config(arch);
    EmbeddingBlock e(c);
    e.init(3);
    e.word().grad.zero();
    check_block(e, tiny_batch(c), c, false);
  }
}

TEST(Layers, MlmHeadWithCrossEntropy) {
  ModelConfig c = tiny_config("bert");
  HeadBlock head(c, nullptr);  // no embedding here: the head owns a mirror of the word matrix
  ASSERT_NE(head.mirror(), nullptr);
  EXPECT_TRUE(head.mirror()->mirror);
  head.init(5);
  fill_normal(head.params()[4]->value.data(), c.vocab, 13, 0.5f);  // a non-zero cls.predictions.bias
  check_block(head, tiny_batch(c), c, true);
  head.set_logit_chunk_rows(2);  // the masked rows' logits two at a time
  for (Param* p : head.params()) p->grad.zero();  // the first check's backward added to them
  check_block(head, tiny_batch(c), c, true);
}

TEST(Layers, LmHeadWithCrossEntropy) {
  ModelConfig c = tiny_config("gpt");
  HeadBlock head(c, nullptr);
  head.init(5);
  MicroBatch mb = tiny_batch(c);
  mb.loss_scale = 0.25f;
  check_block(head, mb, c, true, {.floor = 3e-5});
  head.set_logit_chunk_rows(5);  // 16 rows: three chunks of 5 and one of 1
  for (Param* p : head.params()) p->grad.zero();  // the first check's backward added to them
  check_block(head, mb, c, true, {.floor = 3e-5});
}

// Llama's head: RMSNorm and its own lm_head (untied), or the word matrix's mirror (tied).
TEST(Layers, LlamaLmHeadWithCrossEntropy) {
  for (bool tied : {false, true}) {
    ModelConfig c = tiny_config("llama");
    c.tie_embeddings = tied;
    HeadBlock head(c, nullptr);
    EXPECT_EQ(head.mirror() != nullptr, tied);
    head.init(5);
    fill_normal(head.params()[0]->value.data(), c.hidden, 21, 0.5f);  // model.norm's gain away from 1
    MicroBatch mb = tiny_batch(c);
    mb.loss_scale = 0.25f;
    check_block(head, mb, c, true, {.floor = 3e-5});
    head.set_logit_chunk_rows(7);
    for (Param* p : head.params()) p->grad.zero();  // the first check's backward added to them
    check_block(head, mb, c, true, {.floor = 3e-5});
  }
}

namespace {
// One forward and backward of a head: its loss, input gradient and every parameter's gradient.
struct HeadResult {
  double loss;
  std::vector<float> dx;
  std::vector<std::vector<float>> grads;
};
HeadResult run_head(ModelConfig c, int64_t chunk_rows, int forwards, const MicroBatch& mb) {
  c.logit_chunk_rows = static_cast<int>(chunk_rows);  // model.logit_chunk_rows
  HeadBlock head(c, nullptr);
  EXPECT_EQ(head.logit_chunk_rows(), chunk_rows);
  head.init(5);
  auto st = head.make_state(mb.rows, mb.seq, BackwardMode::split);
  const int64_t N = int64_t(mb.rows) * mb.seq;
  Tensor x = randn({mb.rows, mb.seq, c.hidden}, 11, 3.0f), y, dx({N, c.hidden});
  HeadResult r{};
  for (int f = 0; f < forwards; ++f) r.loss = head.forward(mb, x, y, *st);
  head.backward_input(mb, y, dx, *st);
  head.backward_weight(mb, *st);
  r.dx.assign(dx.data(), dx.data() + dx.numel());
  for (Param* p : head.params()) r.grads.emplace_back(p->grad.data(), p->grad.data() + p->grad.numel());
  return r;
}
// a and b agree to float32 rounding of sums of `terms` products: each entry within
// terms x 2^-23 of the largest entry of its tensor (a bound on the chunked order's rounding).
void expect_close(const std::string& what, const std::vector<float>& a, const std::vector<float>& b, double terms) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (float v : a) scale = std::max(scale, double(std::abs(v)));
  const double tol = terms * std::ldexp(1.0, -23) * scale;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " entry " << i;
}
}  // namespace

// The head's logits a few rows at a time give the loss and gradients of one chunk of all the rows,
// to float32 rounding; a forward run twice on one state (activation recomputation) leaves what one
// leaves; an evaluation forward gives the same loss and no gradients to run a backward on.
TEST(Layers, HeadLogitsInChunksEqualOneChunk) {
  for (const char* arch : {"bert", "gpt", "llama"}) {
    SCOPED_TRACE(arch);
    ModelConfig c = tiny_config(arch);
    MicroBatch mb = tiny_batch(c);
    mb.loss_scale = 0.25f;
    const HeadResult whole = run_head(c, 1 << 20, 1, mb), chunks = run_head(c, 3, 1, mb), again = run_head(c, 3, 2, mb);
    const double terms = 2.0 * (c.vocab + 2 * mb.rows * mb.seq);  // the products' lengths, both ways
    EXPECT_NEAR(chunks.loss, whole.loss, terms * std::ldexp(1.0, -23) * std::abs(whole.loss));
    expect_close("dx", chunks.dx, whole.dx, terms);
    for (size_t p = 0; p < whole.grads.size(); ++p) expect_close("param " + std::to_string(p), chunks.grads[p], whole.grads[p], terms);
    // The loss against whole logits (HeadBlock::logits, inference's path) and a float64 softmax.
    {
      HeadBlock ref(c, nullptr);
      ref.init(5);
      Tensor x = randn({mb.rows, mb.seq, c.hidden}, 11, 3.0f), z({1, c.vocab});
      double want = 0;
      for (int64_t n = 0; n < int64_t(mb.rows) * mb.seq; ++n) {
        if (mb.labels[n] < 0) continue;
        ref.logits(x.data() + n * c.hidden, 1, z.data());
        double top = *std::max_element(z.data(), z.data() + c.vocab), sum = 0;
        for (int64_t v = 0; v < c.vocab; ++v) sum += std::exp(double(z[v]) - top);
        want += mb.loss_scale * (std::log(sum) + top - z[mb.labels[n]]);
      }
      EXPECT_NEAR(chunks.loss, want, terms * std::ldexp(1.0, -23) * std::abs(want));
    }
    // Recomputation: bit for bit, the forward writes nothing outside its state.
    EXPECT_EQ(again.loss, chunks.loss);
    EXPECT_EQ(again.dx, chunks.dx);
    EXPECT_EQ(again.grads, chunks.grads);

    HeadBlock head(c, nullptr);
    head.init(5);
    head.set_logit_chunk_rows(3);
    auto st = head.make_state(mb.rows, mb.seq, BackwardMode::fused);
    Tensor x = randn({mb.rows, mb.seq, c.hidden}, 11, 3.0f), y, dx({int64_t(mb.rows) * mb.seq, c.hidden});
    head.set_training(false);
    EXPECT_EQ(head.forward(mb, x, y, *st), static_cast<float>(chunks.loss));
    EXPECT_THROW(head.backward(mb, y, dx, *st), std::exception);
  }
}

// Llama's decoder layer: RMSNorm, rotary positions, grouped-query attention (2 query heads per
// key/value head), SwiGLU; with dropout on both branches too.
TEST(Layers, LlamaBlock) {
  for (float dropout : {0.0f, 0.2f}) {
    ModelConfig c = tiny_config("llama");
    c.dropout = dropout;
    LlamaBlock blk(c, 1);
    blk.init(9);
    for (Param* p : blk.params())  // RMSNorm gains 1 + N(0, 0.3): not all 1, so their gradients are tested too
      if (p->value.shape().size() == 1) {
        fill_normal(p->value.data(), c.hidden, 23, 0.3f);
        for (float& g : p->value.span()) g += 1;
      }
    blk.set_dropout_step(77, 3);
    check_block(blk, tiny_batch(c), c, true, {.floor = 3e-4});
  }
}

// The rotation's two facts the finite differences cannot see: a query and a key rotated to
// positions t and u give the product of position t - u (so attention sees relative positions),
// and the inverse turns back exactly (to float rounding).
TEST(Layers, RotaryPositionsAreRelativeAndInvertible) {
  const int64_t D = 8, H = 2, T = 6;
  Rope rope(D, 16, 10000.0);
  Tensor q = randn({T, H * D}, 1), k = randn({T, H * D}, 2);
  std::vector<float> q0(q.span().begin(), q.span().end()), k0(k.span().begin(), k.span().end());
  // Every row the same vector, at positions 0..T-1.
  for (int64_t t = 1; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i) q.data()[t * H * D + i] = q0[i], k.data()[t * H * D + i] = k0[i];
  rope.rotate(q.data(), H * D, H, T, T, 0, false);
  rope.rotate(k.data(), H * D, H, T, T, 0, false);
  auto score = [&](int64_t t, int64_t u, int64_t h) { return dot(q.data() + t * H * D + h * D, k.data() + u * H * D + h * D, D); };
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_NEAR(score(3, 1, h), score(2, 0, h), 1e-5) << h;
    EXPECT_NEAR(score(5, 2, h), score(3, 0, h), 1e-5) << h;
    EXPECT_GT(std::abs(score(3, 1, h) - score(3, 0, h)), 1e-3) << "positions must matter";
  }
  EXPECT_NEAR(score(0, 0, 0), dot(q0.data(), k0.data(), D), 1e-6);  // position 0 turns nothing
  // rotate(first = 4) of one row = row 4 of the table; inverse brings it back.
  std::vector<float> one(q0.begin(), q0.begin() + H * D);
  rope.rotate(one.data(), H * D, H, 1, 1, 4, false);
  for (int64_t i = 0; i < H * D; ++i) EXPECT_FLOAT_EQ(one[i], q.data()[4 * H * D + i]);
  rope.rotate(one.data(), H * D, H, 1, 1, 4, true);
  for (int64_t i = 0; i < H * D; ++i) EXPECT_NEAR(one[i], q0[i], 1e-6);
}

TEST(Layers, TransformerBlockBertPostLn) {
  ModelConfig c = tiny_config("bert");
  TransformerBlock blk(c, 0);
  blk.init(9);
  // The key bias adds q.b to a whole row of scores, which softmax ignores: its true gradient is 0
  // and its finite difference is float noise (~1e-4), hence the floor.
  check_block(blk, tiny_batch(c), c, true, {.floor = 3e-4});
  Param* kb = blk.linears()[1]->bias();
  for (float g : kb->grad.span()) EXPECT_LT(std::abs(g), 1e-5f) << kb->name;
}

TEST(Layers, TransformerBlockGptPreLn) {
  ModelConfig c = tiny_config("gpt");
  TransformerBlock blk(c, 1);
  blk.init(9);
  check_block(blk, tiny_batch(c), c, true);
}

TEST(Layers, TransformerBlockWithDropout) {
  for (const char* arch : {"bert", "gpt"}) {
    ModelConfig c = tiny_config(arch);
    c.dropout = 0.2f;
    TransformerBlock blk(c, 0);
    blk.init(9);
    blk.set_dropout_step(77, 3);  // masks fixed by (seed, step, micro-batch): differentiable
    check_block(blk, tiny_batch(c), c, true, {.floor = 3e-4});
  }
}
