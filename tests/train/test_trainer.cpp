// The single-process trainer with kfac.enabled = false: bits pinned from the trainer as it was
// before the K-FAC driver existed, so the K-FAC branch changes none of the plain path's results
// (and no Linear carries a tap).
#include "train/trainer.hpp"
#include "train_fixture.hpp"

#include <gtest/gtest.h>

using namespace pf;

namespace {
double weight_sum(Model& m) {
  double s = 0;
  for (Param* p : m.params())
    for (float v : p->value.span()) s += v;
  return s;
}
}  // namespace

TEST(Trainer, PlainStepsKeepTheirBits) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "the bits are pinned for the Release build's code generation; the sanitizer build "
                  "(RelWithDebInfo, instrumented) rounds differently";
#endif
  Config c = test::sample_config();
  Trainer t(c);
  const double loss[] = {0x1.4b15bdp+3, 0x1.4bc48cp+3, 0x1.4afdeep+3, 0x1.4a27cp+3};
  const double norm[] = {0x1.7392d783bdf73p+1, 0x1.43d12af79b23fp+1, 0x1.5834d4f13b70ep+1, 0x1.3d5d344ae091dp+1};
  for (int s = 0; s < 4; ++s) {
    StepStats st = t.step();
    EXPECT_EQ(st.loss, loss[s]) << "step " << s;
    EXPECT_EQ(st.grad_norm, norm[s]) << "step " << s;
  }
  EXPECT_EQ(weight_sum(t.model()), 0x1.b5ff580b2dbb2p+9);
  EXPECT_EQ(t.evaluate(), 0x1.4b7fc6p+3);
  for (Linear* l : t.model().linears()) EXPECT_EQ(l->tap(), nullptr) << l->name();
}
