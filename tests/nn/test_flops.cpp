// Model FLOPs (nn/flops.hpp), what MFU counts: by hand for one preset, and against the
// multiply-adds the model's sgemm calls actually make in one forward and backward.
#include "fd.hpp"
#include "core/kernel_clock.hpp"
#include "nn/flops.hpp"
#include "nn/model.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>

using namespace pf;
using namespace pf::test;

namespace {
std::atomic<double> g_macs{0};  // m n k of every cblas_sgemm of this program
}

// This program's cblas_sgemm: counts, then calls OpenBLAS's (the next definition of the name).
extern "C" void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER o, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint m,
                            OPENBLAS_CONST blasint n, OPENBLAS_CONST blasint k, OPENBLAS_CONST float alpha,
                            OPENBLAS_CONST float* a, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* b,
                            OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float* c, OPENBLAS_CONST blasint ldc) {
  using Fn = decltype(&cblas_sgemm);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "cblas_sgemm"));
  g_macs.fetch_add(static_cast<double>(m) * n * k, std::memory_order_relaxed);
  real(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

TEST(Flops, BertTinyByHand) {
  // bert-tiny: 2 layers, h 128, f 512, s 128, V 30522; 19 masked positions of 126 (round(0.15 x 126)).
  ModelConfig m;
  m.arch = Arch::Bert, m.layers = 2, m.hidden = 128, m.ffn = 512, m.seq_len = 128, m.vocab = 30522;
  // A block: 4 x 128^2 + 2 x 128 x 512 + 2 x 128 x 128 = 65536 + 131072 + 32768 = 229376, twice: 458752.
  // The head over 19 of 128 positions: 19 x (128^2 + 128 x 30522) / 128 = 19 x 30650 = 582350.
  EXPECT_EQ(forward_macs_per_token(m, 19), 458752.0 + 582350.0);
  EXPECT_EQ(model_flops_per_token(m, 19), 6 * 1041102.0);
  // NSP adds the pooler and the classifier once per sequence: (128^2 + 2 x 128) / 128 = 130 per token.
  m.nsp = true;
  EXPECT_EQ(forward_macs_per_token(m, 19), 1041102.0 + 130);
  // gpt: every position through the decoder, h V = 128 x 30522 = 3906816.
  m.arch = Arch::Gpt, m.nsp = false;
  EXPECT_EQ(forward_macs_per_token(m, 128), 458752.0 + 3906816.0);
  // llama, 2 of 4 heads for keys and values (kv 64), f 512: a block 2 x 128^2 + 2 x 128 x 64 +
  // 3 x 128 x 512 + 2 x 128 x 128 = 32768 + 16384 + 196608 + 32768 = 278528, twice: 557056.
  m.arch = Arch::Llama, m.heads = 4, m.kv_heads = 2;
  EXPECT_EQ(forward_macs_per_token(m, 128), 557056.0 + 3906816.0);
}

namespace {
// The whole tiny model of an architecture (no NSP), one micro-batch and its labelled positions.
struct TinyModel {
  ModelConfig c;
  std::unique_ptr<Model> model;
  MicroBatch mb;
  ModelState st;
  int labelled = 0;
  Tensor none;
};
TinyModel tiny_model(const char* arch) {
  TinyModel t;
  t.c = tiny_config(arch);
  t.c.nsp = false;
  t.model = build_model(t.c, 0, num_blocks(t.c) - 1);
  t.model->init(3);
  t.mb = tiny_batch(t.c);
  t.st = t.model->make_state(t.mb.rows, t.mb.seq);
  for (int i = 0; i < t.mb.rows * t.mb.seq; ++i) t.labelled += t.mb.labels[i] >= 0;
  return t;
}
}  // namespace

class FlopsTest : public ::testing::TestWithParam<const char*> {};

// A forward and a backward of one micro-batch make 3 x the forward's multiply-adds, all counted by
// the formula (exact: the products' sizes are integers well below 2^53). An evaluation forward
// makes the formula's forward; a training forward also the decoder's two backward products (the
// head's logits exist only there, a chunk at a time).
TEST_P(FlopsTest, FormulaCountsTheProductsTheModelComputes) {
  TinyModel tiny = tiny_model(GetParam());
  const ModelConfig& c = tiny.c;
  Model* model = tiny.model.get();
  MicroBatch& mb = tiny.mb;
  ModelState& st = tiny.st;
  Tensor& none = tiny.none;
  const int labelled = tiny.labelled;
  g_macs = 0;
  model->set_training(false);
  model->forward(mb, none, none, st);
  const double evaluation = g_macs;
  model->set_training(true);
  g_macs = 0;
  model->forward(mb, none, none, st);
  const double forward = g_macs;
  model->backward(mb, none, none, st);
  const double tokens = double(mb.rows) * mb.seq;
  const double per_sequence = double(labelled) / mb.rows;
  const double want = forward_macs_per_token(c, per_sequence) * tokens;
  EXPECT_NEAR(evaluation, want, 1e-12 * want);
  EXPECT_NEAR(forward, want + 2.0 * labelled * c.hidden * c.vocab, 1e-12 * want);
  EXPECT_NEAR(g_macs.load(), 3 * want, 3e-12 * want) << "the backward: two products per forward product";
  EXPECT_NEAR(2 * g_macs.load(), model_flops_per_token(c, per_sequence) * tokens, 6e-12 * want);
}

INSTANTIATE_TEST_SUITE_P(Arch, FlopsTest, ::testing::Values("bert", "gpt", "llama"));

// The kernel clock (core/kernel_clock.hpp) files every product under a class with its flops: the
// blocks', the head's and attention's add up to the multiply-adds the sgemm calls made, and the
// head's are its decoder's (and BERT's transform's) three products over the labelled rows
// (forward, input and weight gradients). Exact: integers well below 2^53.
TEST_P(FlopsTest, KernelClockFilesEveryProductUnderItsClass) {
  TinyModel t = tiny_model(GetParam());
  t.model->set_training(true);
  g_macs = 0;
  kernel_clock::start();
  t.model->forward(t.mb, t.none, t.none, t.st);
  t.model->backward(t.mb, t.none, t.none, t.st);
  const KernelTally tally = kernel_clock::stop();
  auto flops = [&](Kernel k) { return tally.flops[static_cast<int>(k)]; };
  const double products = flops(Kernel::block_products) + flops(Kernel::head_products) + flops(Kernel::attention_products);
  EXPECT_EQ(products, 2 * g_macs.load());
  const double transform = t.c.arch == Arch::Bert ? t.c.hidden : 0;
  EXPECT_EQ(flops(Kernel::head_products), 3 * 2.0 * t.labelled * t.c.hidden * (t.c.vocab + transform));
  const double T = t.mb.seq, tokens = double(t.mb.rows) * t.mb.seq;
  EXPECT_EQ(flops(Kernel::attention_products), 6 * 2.0 * T * t.c.hidden * tokens * t.c.layers);
  for (Kernel k : {Kernel::norms, Kernel::activations, Kernel::attention_softmax, Kernel::softmax_loss, Kernel::embedding})
    EXPECT_GT(tally.bytes[static_cast<int>(k)], 0) << kernel_name(k);
  EXPECT_EQ(flops(Kernel::norms) + flops(Kernel::elementwise) + flops(Kernel::softmax_loss), 0);
}
