// The K-FAC driver over a whole (tiny) model: its preconditioned gradients against factors built
// densely in double from the tapped inputs and output gradients, the layers it skips, and a
// factor that is not positive definite.
#include "dense.hpp"
#include "kfac/preconditioner.hpp"
#include "nn/model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

using namespace pf;

namespace {

ModelConfig tiny(const char* arch) {
  ModelConfig c;
  c.arch = parse_name<Arch>(arch).value();
  c.layers = 1;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.seq_len = 6;
  c.max_position = 16;
  c.vocab = 40;
  c.gelu = c.arch == pf::Arch::Bert ? pf::Gelu::Erf : pf::Gelu::Tanh;
  if (c.arch == pf::Arch::Llama) c.kv_heads = 1;  // k and v of width 8 beside q's 16
  return c;
}

// Micro-batch j of a step: random tokens; BERT labels a third of the positions, GPT all.
MicroBatch batch(const ModelConfig& c, int rows, int j, uint32_t seed) {
  MicroBatch mb;
  mb.resize(rows, c.seq_len);
  mb.index = j;
  std::mt19937 gen(seed + 101 * j);
  for (size_t n = 0; n < mb.tokens.size(); ++n) {
    mb.tokens[n] = static_cast<int32_t>(gen() % c.vocab);
    mb.attn_mask[n] = 1;
    mb.token_types[n] = 0;
    const bool labelled = pf::causal_lm(c.arch) || n % 3 == 1;
    mb.labels[n] = labelled ? static_cast<int32_t>(gen() % c.vocab) : -1;
  }
  return mb;
}

// Records what the driver's tap sees (as doubles) and passes it on.
struct Recorder : LinearTap {
  KfacPreconditioner* inner = nullptr;
  std::map<const Linear*, std::vector<std::vector<double>>> x, g;  // per layer, one row each
  void on_input(const Linear& l, int mb, const float* v, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) x[&l].emplace_back(v + r * cols, v + (r + 1) * cols);
    inner->on_input(l, mb, v, rows, cols);
  }
  void on_grad_output(const Linear& l, int mb, const float* v, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) g[&l].emplace_back(v + r * cols, v + (r + 1) * cols);
    inner->on_grad_output(l, mb, v, rows, cols);
  }
};

// (1/T) * k * sum_t v_t v_t^T
dense::Mat outer_mean(const std::vector<std::vector<double>>& rows, double k) {
  const int64_t d = static_cast<int64_t>(rows.at(0).size());
  dense::Mat m(d, d);
  for (const auto& v : rows)
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) m(i, j) += v[i] * v[j];
  for (double& e : m.v) e *= k / static_cast<double>(rows.size());
  return m;
}

dense::Mat matmul(const dense::Mat& a, const dense::Mat& b) {
  dense::Mat c(a.rows, b.cols);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t k = 0; k < a.cols; ++k)
      for (int64_t j = 0; j < b.cols; ++j) c(i, j) += a(i, k) * b(k, j);
  return c;
}

struct Case {
  const char* arch;
  int diag_limit;
};

class DriverTest : public ::testing::TestWithParam<Case> {};

}  // namespace

// Two micro-batches through the whole model with the driver attached (via a recorder), then
// commit, invert, precondition; every K-FAC layer's result against the dense double computation
// (B^-1 G A^-1 with pi-damped factors; diag(B) for layers wider than diag_limit).
TEST_P(DriverTest, PreconditionedGradientsMatchADenseComputation) {
  const Case cs = GetParam();
  const ModelConfig c = tiny(cs.arch);
  auto model = build_model(c, 0, num_blocks(c) - 1);
  model->init(3);
  KfacConfig kc;
  kc.enabled = true;
  kc.placement = pf::Placement::Inline;
  kc.damping = 1e-3;
  kc.diag_limit = cs.diag_limit;
  KfacPreconditioner kfac(model->linears(), kc, c.vocab);
  Recorder rec;
  rec.inner = &kfac;
  for (size_t i = 0; i < kfac.size(); ++i) kfac.linear(i).set_tap(&rec);

  const int rows = 3, n_mb = 2;
  std::vector<MicroBatch> mbs;
  int64_t positions = 0;
  for (int j = 0; j < n_mb; ++j) {
    mbs.push_back(batch(c, rows, j, 11));
    positions += mbs.back().loss_positions();
  }
  const double s = 1.0 / static_cast<double>(positions);
  ModelState st = model->make_state(rows, c.seq_len);
  Tensor none;
  model->zero_grad();
  for (MicroBatch& mb : mbs) {
    mb.loss_scale = static_cast<float>(s);
    model->forward(mb, none, none, st);
    model->backward(mb, none, none, st);
  }
  for (size_t i = 0; i < kfac.size(); ++i) kfac.linear(i).set_tap(nullptr);
  std::vector<Tensor> raw_w, raw_b;
  for (size_t i = 0; i < kfac.size(); ++i) {
    raw_w.push_back(kfac.linear(i).weight().grad);
    raw_b.push_back(kfac.linear(i).bias() ? kfac.linear(i).bias()->grad : Tensor());
  }
  EXPECT_EQ(kfac.finish_curvature(static_cast<float>(s)), static_cast<int>(2 * kfac.size()));
  const InversionSummary inv = kfac.invert_all();
  EXPECT_EQ(inv.factors, static_cast<int>(2 * kfac.size()));
  EXPECT_EQ(inv.raised + inv.kept, 0);
  kfac.precondition_all();

  int diagonal = 0;
  for (size_t i = 0; i < kfac.size(); ++i) {
    Linear& l = kfac.linear(i);
    SCOPED_TRACE(l.name());
    const auto& xs = rec.x.at(&l);
    const auto& gs = rec.g.at(&l);
    ASSERT_EQ(xs.size(), gs.size());
    // The convention of kfac_layer.hpp: A = E_t[x x^T], B = 1/(T s^2) sum_t g g^T.
    dense::Mat a = outer_mean(xs, 1.0), b = outer_mean(gs, 1.0 / (s * s));
    const bool diag_b = l.out() > cs.diag_limit;
    EXPECT_EQ(kfac.layer(i).diagonal_b(), diag_b);
    diagonal += diag_b;
    if (diag_b)
      for (int64_t r = 0; r < b.rows; ++r)
        for (int64_t q = 0; q < b.cols; ++q)
          if (r != q) b(r, q) = 0;
    const double pi = std::sqrt((dense::trace(a) / a.rows) / (dense::trace(b) / b.rows));
    const double root = std::sqrt(kc.damping);
    const dense::Mat ai = dense::inverse(dense::add_diag(a, root * pi));
    const dense::Mat bi = dense::inverse(dense::add_diag(b, root / pi));
    const dense::Mat want = matmul(matmul(bi, dense::from_tensor(raw_w[i])), ai);
    const dense::Mat got = dense::from_tensor(l.weight().grad);
    EXPECT_LT(dense::rel_err(got.v, want.v), 1e-5);
    if (l.bias()) {
      dense::Mat gb(l.out(), 1);
      for (int64_t k = 0; k < l.out(); ++k) gb(k, 0) = raw_b[i][k];
      const dense::Mat wb = matmul(bi, gb);
      std::vector<double> hb(l.bias()->grad.span().begin(), l.bias()->grad.span().end());
      EXPECT_LT(dense::rel_err(hb, wb.v), 1e-5);
    }
  }
  if (cs.diag_limit < c.ffn) {
    EXPECT_GT(diagonal, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DriverTest,
                         ::testing::Values(Case{"bert", 10000}, Case{"gpt", 10000}, Case{"bert", 20},
                                           Case{"gpt", 40}, Case{"llama", 10000}, Case{"llama", 12}));

// The decoder (outputs = vocabulary, the tied word embedding) is left out and never tapped;
// every other Linear is a K-FAC layer (llama: q, k, v, o, gate, up and down).
TEST(Driver, SkipsTheDecoder) {
  for (const char* arch : {"bert", "gpt", "llama"}) {
    const ModelConfig c = tiny(arch);
    auto model = build_model(c, 0, num_blocks(c) - 1);
    KfacPreconditioner kfac(model->linears(), KfacConfig{}, c.vocab);
    const std::string decoder = arch == std::string("bert")  ? "bert.embeddings.word_embeddings.weight"
                                : arch == std::string("gpt") ? "transformer.wte.weight"
                                                             : "model.embed_tokens.weight";
    ASSERT_EQ(kfac.skipped(), std::vector<std::string>{decoder});
    EXPECT_EQ(kfac.size(), model->linears().size() - 1);
    kfac.attach();
    for (Linear* l : model->linears()) {
      const bool is_decoder = l->out() == c.vocab;
      EXPECT_EQ(l->name() == decoder, is_decoder);
      EXPECT_EQ(l->tap() != nullptr, !is_decoder) << l->name();
      EXPECT_EQ(kfac.index_of(*l) >= 0, !is_decoder) << l->name();
    }
    kfac.detach();
    for (Linear* l : model->linears()) EXPECT_EQ(l->tap(), nullptr);
  }
  // A stage without the head has nothing to skip.
  const ModelConfig c = tiny("bert");
  auto stage = build_model(c, 1, 1);
  KfacPreconditioner kfac(stage->linears(), KfacConfig{}, c.vocab);
  EXPECT_TRUE(kfac.skipped().empty());
  EXPECT_EQ(kfac.size(), 6u);
}

// A factor that is not positive definite (here negative definite beyond any damping raise) does
// not throw: the previous inverse stays, the summary counts it.
TEST(Driver, NonPositiveDefiniteFactorKeepsThePreviousInverse) {
  const ModelConfig c = tiny("bert");
  auto model = build_model(c, 1, 1);
  KfacConfig kc;
  kc.damping = 1e-3;
  KfacPreconditioner kfac(model->linears(), kc, c.vocab);
  const int64_t d = kfac.layer(0).d_in(), o = kfac.layer(0).d_out();
  Tensor a({d, d}), b({o, o});
  for (int64_t k = 0; k < d; ++k) a[k * d + k] = 1.0f;
  for (int64_t k = 0; k < o; ++k) b[k * o + k] = 2.0f;
  kfac.layer(0).factor(Side::A).set_value(a);
  kfac.layer(0).factor(Side::B).set_value(b);
  ASSERT_TRUE(kfac.invert(0, Side::A).ok());
  const Tensor before = kfac.layer(0).a().inverse();
  for (int64_t k = 0; k < d; ++k) a[k * d + k] = -1e6f;
  kfac.layer(0).factor(Side::A).set_value(a);
  InversionSummary sum;
  EXPECT_NO_THROW(sum = kfac.invert_all());
  EXPECT_GE(sum.kept, 1);
  EXPECT_GT(sum.retries, 0);
  const Tensor& after = kfac.layer(0).a().inverse();
  for (int64_t k = 0; k < after.numel(); ++k) ASSERT_EQ(after[k], before[k]);
}
