// The kernel clock's attribution (core/kernel_clock.hpp): exclusive time to the innermost scope,
// products inside the head filed as the head's, the optimizer opaque, nothing recorded while
// stopped or from another thread. Sleeps give lower bounds only; no test here waits on an upper one
// except the sum of the parts against the wall clock around them, which holds by construction.
#include "core/kernel_clock.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

using namespace pf;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
double seconds(const KernelTally& t, Kernel k) { return t.seconds[static_cast<int>(k)]; }
double total(const KernelTally& t) {
  double s = 0;
  for (double x : t.seconds) s += x;
  return s;
}
}  // namespace

TEST(KernelClock, InnermostScopeGetsItsOwnTimeAndTheOuterTheRest) {
  const auto t0 = std::chrono::steady_clock::now();
  kernel_clock::start();
  {
    KernelScope outer(Kernel::norms, 100);
    sleep_ms(20);
    {
      KernelScope inner(Kernel::activations, 7, 0);
      sleep_ms(30);
    }
  }
  sleep_ms(5);  // outside every scope: the step's other
  const KernelTally t = kernel_clock::stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(seconds(t, Kernel::norms), 0.020);
  EXPECT_GE(seconds(t, Kernel::activations), 0.030);
  EXPECT_LE(total(t), wall - 0.005);
  EXPECT_EQ(t.bytes[static_cast<int>(Kernel::norms)], 100);
  EXPECT_EQ(t.bytes[static_cast<int>(Kernel::activations)], 7);
}

TEST(KernelClock, ProductsInsideTheHeadAreTheHeadsAndTheOptimizerIsOpaque) {
  kernel_clock::start();
  {
    KernelScope head(Kernel::head);
    KernelScope product(Kernel::block_products, 0, 10);
    sleep_ms(10);
  }
  {
    KernelScope product(Kernel::block_products, 0, 3);
  }
  {
    KernelScope opt(Kernel::optimizer, 50);
    KernelScope inner(Kernel::elementwise, 1000);  // folds into the optimizer
    sleep_ms(10);
  }
  const KernelTally t = kernel_clock::stop();
  EXPECT_EQ(t.flops[static_cast<int>(Kernel::head_products)], 10);
  EXPECT_EQ(t.flops[static_cast<int>(Kernel::block_products)], 3);
  EXPECT_GE(seconds(t, Kernel::head_products), 0.010);
  EXPECT_GE(seconds(t, Kernel::optimizer), 0.010);
  EXPECT_EQ(seconds(t, Kernel::elementwise), 0);
  EXPECT_EQ(t.bytes[static_cast<int>(Kernel::elementwise)], 0);
  EXPECT_EQ(t.bytes[static_cast<int>(Kernel::optimizer)], 50);
}

TEST(KernelClock, RecordsNothingWhileStoppedOrFromAnotherThread) {
  {
    KernelScope before(Kernel::norms, 1);
    sleep_ms(2);
  }
  kernel_clock::start();
  std::thread other([] {
    KernelScope elsewhere(Kernel::norms, 1);
    sleep_ms(5);
  });
  other.join();
  const KernelTally t = kernel_clock::stop();
  {
    KernelScope after(Kernel::norms, 1);
  }
  EXPECT_EQ(total(t), 0);
  EXPECT_EQ(t.bytes[static_cast<int>(Kernel::norms)], 0);
  // A new start begins from zero.
  kernel_clock::start();
  EXPECT_EQ(total(kernel_clock::stop()), 0);
}
