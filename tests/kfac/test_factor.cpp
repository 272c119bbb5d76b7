// KfacFactor: EMA arithmetic, the factor left untouched by inversion, recovery from factors that
// are not positive definite or not finite, block-diagonal inversion, checkpoints, cost estimates.
#include "dense.hpp"
#include "core/blas.hpp"
#include "kfac/kfac_layer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace pf {
namespace {

using dense::Mat;

// Rows of small integers: x^T x is exact in float, so EMA results can be compared bitwise.
Tensor int_rows(int64_t t, int64_t d, int seed) {
  Tensor x({t, d});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>((i * 7 + seed * 3) % 5 - 2);
  return x;
}

Mat gram(const Tensor& x) {
  Mat m(x.dim(1), x.dim(1));
  for (int64_t r = 0; r < x.dim(0); ++r)
    for (int64_t i = 0; i < x.dim(1); ++i)
      for (int64_t j = 0; j < x.dim(1); ++j) m(i, j) += double(x[r * x.dim(1) + i]) * x[r * x.dim(1) + j];
  return m;
}

TEST(KfacFactor, EmaArithmeticIsExact) {
  const int64_t d = 4;
  Tensor x1 = int_rows(3, d, 1), x2 = int_rows(5, d, 2), x3 = int_rows(2, d, 3);
  KfacFactor ema("A", d, FactorKind::Dense, 1, 0.75);
  KfacFactor latest("A", d, FactorKind::Dense, 1, 0.0);
  EXPECT_FALSE(ema.commit());  // nothing accumulated yet
  for (KfacFactor* f : {&ema, &latest}) {
    f->accumulate(x1.data(), 3, d, 1.0f);
    EXPECT_TRUE(f->commit());
  }
  Mat g1 = gram(x1), g2 = gram(x2), g3 = gram(x3);
  EXPECT_EQ(dense::max_abs_diff(dense::from_tensor(ema.value()), g1), 0.0);  // first step: the sum itself
  for (KfacFactor* f : {&ema, &latest}) {
    f->accumulate(x2.data(), 3, d, 1.0f);       // step 2 in two micro-batches
    f->accumulate(x2.data() + 3 * d, 2, d, 1.0f);
    f->commit();
  }
  Mat expect(d, d);
  for (size_t i = 0; i < expect.v.size(); ++i) expect.v[i] = 0.75 * g1.v[i] + 0.25 * g2.v[i];
  EXPECT_EQ(dense::max_abs_diff(dense::from_tensor(ema.value()), expect), 0.0);
  EXPECT_EQ(dense::max_abs_diff(dense::from_tensor(latest.value()), g2), 0.0);
  EXPECT_EQ(ema.trace(), dense::trace(expect));
  for (KfacFactor* f : {&ema, &latest}) {
    f->accumulate(x3.data(), 2, d, 1.0f);
    f->commit();
  }
  for (size_t i = 0; i < expect.v.size(); ++i) expect.v[i] = 0.75 * expect.v[i] + 0.25 * g3.v[i];
  EXPECT_EQ(dense::max_abs_diff(dense::from_tensor(ema.value()), expect), 0.0);
  EXPECT_EQ(dense::max_abs_diff(dense::from_tensor(latest.value()), g3), 0.0);
  EXPECT_EQ(ema.commits(), 3);
}

TEST(KfacFactor, DiagonalFactorAccumulatesSquares) {
  Tensor x = int_rows(4, 3, 5);
  KfacFactor f("B", 3, FactorKind::Diagonal);
  f.accumulate(x.data(), 4, 3, 0.5f);
  f.commit();
  Mat g = gram(x);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(f.value()[i], 0.5 * g(i, i));
}

TEST(KfacFactor, InversionLeavesTheFactorBitwiseUnchanged) {
  const int64_t d = 6;
  Tensor x = dense::randn({10, d}, 3);
  KfacFactor f("A", d);
  f.accumulate(x.data(), 10, d, 0.1f);
  f.commit();
  const Tensor before = f.value();
  ASSERT_EQ(f.invert(0.05).status, InvertStatus::Ok);
  ASSERT_EQ(f.invert(0.5).status, InvertStatus::Ok);
  EXPECT_EQ(std::memcmp(before.data(), f.value().data(), before.numel() * sizeof(float)), 0);
  // The inverse is that of the damped factor.
  Mat ref = dense::inverse(dense::add_diag(dense::from_tensor(before), 0.5));
  EXPECT_LT(dense::max_abs_diff(dense::from_tensor(f.inverse()), ref), 1e-5);
  EXPECT_EQ(f.inversions(), 2);

  // Through a layer too: both factors unchanged by update_inverse.
  KfacLayer layer("l", 5, 4);
  Tensor xa = dense::randn({12, 5}, 4), ga = dense::randn({12, 4}, 5);
  layer.update_curvature(xa.data(), ga.data(), 12, curvature_scale(12, 0.5));
  layer.finish_curvature();
  const Tensor a0 = layer.a().value(), b0 = layer.b().value();
  layer.update_inverse(1e-3);
  EXPECT_EQ(std::memcmp(a0.data(), layer.a().value().data(), a0.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(b0.data(), layer.b().value().data(), b0.numel() * sizeof(float)), 0);
}

TEST(KfacFactor, SingularFactorRaisesDampingAndSucceeds) {
  // A zero factor with zero damping: Cholesky fails, the damping rises from its floor (1e-6).
  KfacFactor f("A", 3);
  Tensor x({2, 3});
  f.accumulate(x.data(), 2, 3, 1.0f);
  f.commit();
  InvertResult r = f.invert(0.0);
  EXPECT_EQ(r.status, InvertStatus::Raised);
  EXPECT_EQ(r.retries, 1);
  EXPECT_EQ(r.damping, 1e-6);
  EXPECT_EQ(f.retries(), 1);
  EXPECT_EQ(f.failures(), 0);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(f.inverse()[i * 3 + j], i == j ? 1e6 : 0.0, i == j ? 1.0 : 0.0);
}

TEST(KfacFactor, IndefiniteFactorRetriesThenKeepsPreviousInverse) {
  Tensor m({2, 2});
  m[0] = 1; m[1] = 3; m[2] = 3; m[3] = 1;  // eigenvalues 4 and -2
  // Enough retries: 0.01 -> 0.1 -> 1 (all indefinite) -> 10 succeeds.
  KfacFactor ok("A", 2, FactorKind::Dense, 1, 0.0, 3);
  ok.set_value(m);
  InvertResult r = ok.invert(0.01);
  EXPECT_EQ(r.status, InvertStatus::Raised);
  EXPECT_EQ(r.retries, 3);
  EXPECT_NEAR(r.damping, 10.0, 1e-9);
  Mat ref = dense::inverse(dense::add_diag(dense::from_tensor(m), static_cast<float>(r.damping)));
  EXPECT_LT(dense::max_abs_diff(dense::from_tensor(ok.inverse()), ref), 1e-6);

  // Too few retries: fails, keeps the previous inverse (the identity), no exception.
  KfacFactor bad("A", 2, FactorKind::Dense, 1, 0.0, 2);
  bad.set_value(m);
  const Tensor prev = bad.inverse();
  r = bad.invert(0.01);
  EXPECT_EQ(r.status, InvertStatus::Failed);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(bad.failures(), 1);
  EXPECT_EQ(bad.retries(), 2);
  EXPECT_EQ(std::memcmp(prev.data(), bad.inverse().data(), prev.numel() * sizeof(float)), 0);
  EXPECT_EQ(bad.inverse()[0], 1.0f);

  // Diagonal factors too: a negative entry.
  KfacFactor diag("B", 2, FactorKind::Diagonal, 1, 0.0, 1);
  Tensor dv({2});
  dv[0] = 2; dv[1] = -0.5f;
  diag.set_value(dv);
  r = diag.invert(0.1);  // 0.1 -> 1: -0.5 + 1 > 0
  EXPECT_EQ(r.status, InvertStatus::Raised);
  EXPECT_FLOAT_EQ(diag.inverse()[1], 1.0f / 0.5f);
  EXPECT_FLOAT_EQ(diag.inverse()[0], 1.0f / 3.0f);
}

TEST(KfacFactor, NanFactorKeepsPreviousInverseAndPreconditionStillRuns) {
  KfacLayer layer("l", 3, 2);
  Tensor x = dense::randn({6, 3}, 8), g = dense::randn({6, 2}, 9);
  layer.update_curvature(x.data(), g.data(), 6, curvature_scale(6, 1.0));
  layer.finish_curvature();
  ASSERT_TRUE(layer.update_inverse(0.01).ok());
  const Tensor a_inv = layer.a().inverse();

  x[4] = std::numeric_limits<float>::quiet_NaN();  // the next step's activations hold a NaN
  layer.update_curvature(x.data(), g.data(), 6, curvature_scale(6, 1.0));
  layer.finish_curvature();
  InvertResult r = layer.invert(Side::A, 0.01);
  EXPECT_EQ(r.status, InvertStatus::NonFinite);
  EXPECT_EQ(layer.a().failures(), 1);
  EXPECT_EQ(std::memcmp(a_inv.data(), layer.a().inverse().data(), a_inv.numel() * sizeof(float)), 0);

  Param w("w", {2, 3});
  w.grad = dense::randn({2, 3}, 10);
  layer.precondition(w, nullptr);
  for (float v : w.grad.span()) EXPECT_TRUE(std::isfinite(v));
}

// Each diagonal block of `inv` equals the dense double-precision inverse of the factor's block plus
// damping. Cholesky's backward error is ~ order x float32 epsilon x condition number: within 1e-4
// of the inverse's diagonal for the well-conditioned blocks tested here.
void expect_blocks_inverted_densely(const KfacFactor& f, const Mat& inv, double damping) {
  const int64_t d = f.dim();
  for (const FactorBlock& b : f.blocks()) {
    Mat blk(b.size, b.size);
    for (int64_t i = 0; i < b.size; ++i)
      for (int64_t j = 0; j < b.size; ++j) blk(i, j) = f.value()[(b.offset + i) * d + b.offset + j];
    Mat ref = dense::inverse(dense::add_diag(blk, damping));
    for (int64_t i = 0; i < b.size; ++i)
      for (int64_t j = 0; j < b.size; ++j)
        EXPECT_NEAR(inv(b.offset + i, b.offset + j), ref(i, j), 1e-4 * std::abs(ref(i, i)))
            << "block at " << b.offset << ": " << i << "," << j;
  }
}

TEST(KfacFactor, BlockInversionEqualsInvertingEachBlockDensely) {
  const int64_t d = 7;
  Tensor x = dense::randn({20, d}, 12);
  KfacFactor f("A", d, FactorKind::Dense, 3);  // blocks 3, 2, 2
  ASSERT_EQ(f.num_blocks(), 3);
  EXPECT_EQ(f.blocks()[1].offset, 3);
  f.accumulate(x.data(), 20, d, 0.05f);
  f.commit();
  Mat full = gram(x);
  for (double& v : full.v) v *= 0.05f;
  // The factor is the block-diagonal part of the full one.
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      bool same = (i < 3) == (j < 3) && (i < 5) == (j < 5);
      if (same)
        EXPECT_NEAR(f.value()[i * d + j], full(i, j), 1e-5);
      else
        EXPECT_EQ(f.value()[i * d + j], 0.0f);
    }
  // Blocks inverted as separate work units, in any order.
  const double damping = 0.02;
  for (int j : {2, 0, 1}) ASSERT_EQ(f.invert_block(j, damping).status, InvertStatus::Ok);
  Mat inv = dense::from_tensor(f.inverse());
  expect_blocks_inverted_densely(f, inv, damping);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      if ((i < 3) != (j < 3) || (i < 5) != (j < 5)) {
        EXPECT_EQ(inv(i, j), 0.0);
      }
  // Re-partitioning drops the entries between the new blocks.
  f.set_blocks(7);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      if (i != j) {
        EXPECT_EQ(f.value()[i * d + j], 0.0f);
      }
}

// Blocks of odd order from 133 up crash Debian's OpenBLAS 0.3.21 inside spotri with some kernel
// families (core/machine.hpp; scripts/test-kernels.sh runs this file with Prescott, where they do):
// such blocks are inverted padded to even order, and must still equal the dense inverse. One
// thread, as a pipeline rank runs: OpenBLAS's threaded strtri takes another path.
TEST(KfacFactor, OddOrderBlocksInvertOnEveryKernelFamily) {
  const int threads = num_threads();
  set_threads(1);
  const int64_t d = 342, t = 1000;  // two blocks of 171
  Tensor x = dense::randn({t, d}, 21);
  KfacFactor f("A", d, FactorKind::Dense, 2);
  ASSERT_EQ(f.blocks()[0].size, 171);
  f.accumulate(x.data(), t, d, 1.0f / t);
  f.commit();
  const double damping = 0.01;
  for (int j : {1, 0}) ASSERT_EQ(f.invert_block(j, damping).status, InvertStatus::Ok);
  Mat inv = dense::from_tensor(f.inverse());
  expect_blocks_inverted_densely(f, inv, damping);
  set_threads(threads);
}

TEST(KfacFactor, SplitAndCosts) {
  std::vector<FactorBlock> b = split_blocks(10, 3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].offset, 0); EXPECT_EQ(b[0].size, 4);
  EXPECT_EQ(b[1].offset, 4); EXPECT_EQ(b[1].size, 3);
  EXPECT_EQ(b[2].offset, 7); EXPECT_EQ(b[2].size, 3);
  EXPECT_EQ(inversion_flops(10, 3), 64.0 + 27 + 27);
  EXPECT_EQ(inversion_flops(10, 1), 1000.0);
  EXPECT_EQ(curvature_flops(10, 3, 5), 5.0 * (16 + 9 + 9));
  EXPECT_EQ(curvature_flops(10, 1, 5, FactorKind::Diagonal), 50.0);
  EXPECT_EQ(blocks_for_budget(4096, 1024.0 * 1024 * 1024), 4);
  EXPECT_EQ(blocks_for_budget(4096, 1024.0 * 1024 * 1024 - 1), 5);
  EXPECT_EQ(blocks_for_budget(1000, 1e9), 1);
  KfacLayerOptions opt;
  opt.blocks_a = 2;
  KfacLayer layer("l", 8, 3, opt);
  EXPECT_EQ(layer.inversion_cost(Side::A), 128.0);
  EXPECT_EQ(layer.inversion_cost_block(Side::A, 1), 64.0);
  EXPECT_EQ(layer.inversion_cost(Side::B), 27.0);
  EXPECT_EQ(layer.curvature_cost(Side::A, 10), 10.0 * 32);
}

TEST(KfacState, SaveLoadRoundTrip) {
  KfacLayerOptions opt;
  opt.ema_decay = 0.5;
  KfacLayer a("enc.0.dense", 4, 3, opt), b("enc.0.dense", 4, 3, opt);
  for (int step = 0; step < 2; ++step) {
    Tensor x = dense::randn({5, 4}, 20 + step), g = dense::randn({5, 3}, 30 + step);
    a.update_curvature(x.data(), g.data(), 5, curvature_scale(5, 0.2));
    a.finish_curvature();
  }
  a.update_inverse(0.01);
  NamedTensors st = a.state();
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[0].first, "enc.0.dense.kfac.A");
  EXPECT_EQ(st[1].first, "enc.0.dense.kfac.A_inv");
  EXPECT_EQ(st[5].first, "enc.0.dense.kfac.B_counters");
  b.load_state(st);
  for (Side s : {Side::A, Side::B}) {
    const KfacFactor &fa = a.factor(s), &fb = b.factor(s);
    EXPECT_EQ(std::memcmp(fa.value().data(), fb.value().data(), fa.value().numel() * 4), 0);
    EXPECT_EQ(std::memcmp(fa.inverse().data(), fb.inverse().data(), fa.inverse().numel() * 4), 0);
    EXPECT_EQ(fa.commits(), fb.commits());
    EXPECT_EQ(fb.commits(), 2);
    EXPECT_EQ(fa.inversions(), fb.inversions());
    EXPECT_EQ(fa.trace(), fb.trace());
  }
  // The next EMA step continues from the loaded factor identically.
  Tensor x = dense::randn({5, 4}, 40), g = dense::randn({5, 3}, 41);
  for (KfacLayer* l : {&a, &b}) {
    l->update_curvature(x.data(), g.data(), 5, curvature_scale(5, 0.2));
    l->finish_curvature();
  }
  EXPECT_EQ(std::memcmp(a.a().value().data(), b.a().value().data(), 16 * 4), 0);

  NamedTensors missing(st.begin(), st.end() - 1);
  EXPECT_THROW(b.load_state(missing), UsageError);
  NamedTensors wrong = st;
  wrong[0].second = Tensor({3, 3});
  try {
    b.load_state(wrong);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("enc.0.dense.kfac.A"), std::string::npos);
  }
}

}  // namespace
}  // namespace pf

namespace pf {
namespace {

TEST(KfacFactor, InvertingAHalfAccumulatedFactorIsRefusedWithoutEma) {
  Tensor x = dense::randn({4, 3}, 50);
  KfacFactor in_place("A", 3);                                  // ema 0: sums in the factor
  KfacFactor separate("A", 3, FactorKind::Dense, 1, 0.5);       // ema > 0: own buffer
  for (KfacFactor* f : {&in_place, &separate}) {
    f->accumulate(x.data(), 4, 3, 1.0f);
    f->commit();
    f->accumulate(x.data(), 2, 3, 1.0f);                        // next step under way
  }
  EXPECT_THROW(in_place.invert(0.1), std::logic_error);
  const Tensor before = separate.value();
  EXPECT_EQ(separate.invert(0.1).status, InvertStatus::Ok);     // inverts the last committed factor
  Mat ref = dense::inverse(dense::add_diag(dense::from_tensor(before), 0.1f));
  EXPECT_LT(dense::max_abs_diff(dense::from_tensor(separate.inverse()), ref), 1e-5);
}

}  // namespace
}  // namespace pf

namespace pf {
namespace {

// An own accumulator with ema 0 (PipeFisher's Chimera group inverts cycle c's factors while cycle
// c+1's curvature accumulates): the committed factor stays what it was while the next sum grows,
// it inverts as the committed factor, and the next commit gives the in-place factor's value.
TEST(KfacFactor, OwnAccumulatorKeepsTheCommittedFactorWhileSumming) {
  Tensor x = int_rows(6, 4, 7), y = int_rows(5, 4, 11);
  KfacFactor in_place("A", 4), own("A", 4);
  own.set_own_accumulator(true);
  EXPECT_TRUE(own.own_accumulator());
  for (KfacFactor* f : {&in_place, &own}) {
    f->accumulate(x.data(), 6, 4, 1.0f);
    f->commit();
  }
  const Tensor committed = own.value();
  EXPECT_EQ(std::memcmp(committed.data(), in_place.value().data(), committed.numel() * sizeof(float)), 0);
  own.accumulate(y.data(), 5, 4, 1.0f);
  in_place.accumulate(y.data(), 5, 4, 1.0f);
  EXPECT_EQ(std::memcmp(committed.data(), own.value().data(), committed.numel() * sizeof(float)), 0);
  ASSERT_EQ(own.invert(0.1).status, InvertStatus::Ok);
  Mat ref = dense::inverse(dense::add_diag(dense::from_tensor(committed), 0.1));
  EXPECT_LT(dense::max_abs_diff(dense::from_tensor(own.inverse()), ref), 1e-5);
  own.commit();
  in_place.commit();
  EXPECT_EQ(std::memcmp(in_place.value().data(), own.value().data(), committed.numel() * sizeof(float)), 0);
  EXPECT_EQ(own.trace(), in_place.trace());
  // Switching off mid-sum moves the sum in progress into the factor.
  own.accumulate(x.data(), 6, 4, 1.0f);
  own.set_own_accumulator(false);
  EXPECT_FALSE(own.own_accumulator());
  own.commit();
  Mat want = gram(x);
  EXPECT_LT(dense::max_abs_diff(dense::from_tensor(own.value()), want), 1e-6);
}

}  // namespace
}  // namespace pf
