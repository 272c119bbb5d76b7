// Curvature and precondition make no heap allocation after construction: operator new is
// counted while they run. (OpenBLAS's own buffers are allocated once, at its start-up.)
#include "dense.hpp"
#include "kfac/kfac_layer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace pf {
namespace {

TEST(KfacNoAlloc, CurvatureAndPreconditionDoNotAllocate) {
  for (bool diag : {false, true}) {
    KfacLayerOptions opt;
    opt.ema_decay = 0.9;
    opt.blocks_a = 2;
    if (diag) opt.diag_limit = 16;
    const int64_t d_in = 40, d_out = 70, rows = 33;
    KfacLayer layer("l", d_in, d_out, opt);
    Tensor x = dense::randn({rows, d_in}, 1), g = dense::randn({rows, d_out}, 2);
    Param w("w", {d_out, d_in}), b("b", {d_out});
    w.grad = dense::randn({d_out, d_in}, 3);
    b.grad = dense::randn({d_out}, 4);
    layer.update_curvature(x.data(), g.data(), rows, curvature_scale(rows, 0.1));  // warm-up
    layer.finish_curvature();
    layer.update_inverse(0.01);

    allocations = 0;
    counting = true;
    const CurvatureScale s = curvature_scale(2 * rows, 0.1);
    for (int step = 0; step < 2; ++step) {
      layer.curvature_a(x.data(), rows, s);
      layer.curvature_b(g.data(), rows, s);
      layer.curvature_a(x.data(), rows, s);
      layer.curvature_b(g.data(), rows, s);
      layer.finish_curvature(Side::A);
      layer.finish_curvature(Side::B);
      layer.precondition(w, &b);
    }
    counting = false;
    EXPECT_EQ(allocations.load(), 0) << (diag ? "diagonal B" : "dense B");
    // The counter works: an allocation under counting is seen.
    counting = true;
    auto* probe = new int(1);
    counting = false;
    delete probe;
    EXPECT_EQ(allocations.load(), 1);
  }
}

}  // namespace
}  // namespace pf
