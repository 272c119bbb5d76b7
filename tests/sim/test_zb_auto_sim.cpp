// zb-auto and zb-v timed and their memory: never slower than Qi et al.'s handcrafted orders with
// the same memory, within the limit, zb-v within 1F1B's memory.
#include "schedule/generators.hpp"
#include "sim/memory.hpp"
#include "sim/sim.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace pf {
namespace {

CostModel split_cost(double tf, double ti, double tw) {
  CostModel c;
  c.stages[0].forward = tf;
  c.stages[0].input_grad = ti;
  c.stages[0].weight_grad = tw;
  c.stages[0].backward = ti + tw;
  return c;
}

// (T_F, T_I, T_W): equal, I or W or F dominant, W longer than F.
const std::array<std::array<double, 3>, 10> kTimes = {{{1, 1, 1},
                                                       {1, 2, 1},
                                                       {2, 1, 1},
                                                       {1, 1, 0.5},
                                                       {1.5, 1, 0.75},
                                                       {1, 1.5, 1},
                                                       {3, 2, 1},
                                                       {1, 1, 2},
                                                       {1, 0.5, 1.5},
                                                       {2, 3, 0.5}}};

TEST(ZbAuto, NeverSlowerThanH1AtItsMemoryNorH2AtTwice) {
  for (int D = 2; D <= 8; ++D)
    for (int N : {D, 2 * D, 3 * D + 1})
      for (auto [f, i, w] : kTimes) {
        SCOPED_TRACE(fmt::format("D={} N={} times {},{},{}", D, N, f, i, w));
        const CostModel cost = split_cost(f, i, w);
        const ZbSpec spec{.forward = f, .input_grad = i, .weight_grad = w};
        for (double X : {1.0, 2.0}) {
          const Timeline tl = simulate(make_zb_auto(D, N, {spec.forward, spec.input_grad, spec.weight_grad, 0, X}), cost);
          const Timeline zb = simulate(X == 1 ? make_zb_h1(D, N) : make_zb_h2(D, N), cost);
          EXPECT_LE(tl.step_time, zb.step_time * (1 + 1e-12)) << "X=" << X;
          // F to W: stage activations held, never above X times 1F1B's D.
          for (int d = 0; d < D; ++d) EXPECT_LE(tl.peak_in_flight[d], X * D) << "X=" << X << " device " << d;
        }
      }
}

TEST(ZbAuto, CommunicationDelaysAreInTheOrder) {
  // With T_comm the heuristic waits for messages as the simulator does: still no slower than H1.
  for (int D = 2; D <= 6; ++D) {
    CostModel cost = split_cost(1, 1, 1);
    cost.p2p_latency = 0.3;
    const Timeline tl = simulate(make_zb_auto(D, 2 * D, {.comm = 0.3}), cost);
    EXPECT_LE(tl.step_time, simulate(make_zb_h1(D, 2 * D), cost).step_time * (1 + 1e-12)) << "D=" << D;
  }
}

TEST(ZbV, WithinOneFOneBMemoryAndNoSlowerThanH1) {
  // Equal times: a zb-v chunk is half a zb-h1 stage, its activations half a stage's.
  for (int D = 2; D <= 8; ++D)
    for (int N : {D, 2 * D, 3 * D + 1})
      for (auto [f, i, w] : kTimes) {
        SCOPED_TRACE(fmt::format("D={} N={} times {},{},{}", D, N, f, i, w));
        const Schedule v = make_zb_v(D, N, {.forward = f / 2, .input_grad = i / 2, .weight_grad = w / 2});
        const Schedule o = make_1f1b(D, N);
        const Timeline tv = simulate(v, split_cost(f / 2, i / 2, w / 2));
        const Timeline to = simulate(o, split_cost(f, i, w));
        EXPECT_LE(tv.step_time, simulate(make_zb_h1(D, N), split_cost(f, i, w)).step_time * (1 + 1e-12));
        StageMemory stage{.param = 1, .act = 1}, chunk{.param = 0.5, .act = 0.5};
        const MemoryReport mv = memory_model(v, tv, {chunk}), mo = memory_model(o, to, {stage});
        EXPECT_LE(mv.activations_in_flight, mo.activations_in_flight);
        for (int d = 0; d < D; ++d) EXPECT_LE(tv.peak_in_flight[d], 2 * D) << "device " << d;
      }
}

TEST(ZbV, MemoryModelCountsBothChunksOfADevice) {
  // Device 0 hosts stages 0 and 2D-1: two chunks' parameters and all their micro-batches.
  const int D = 4, N = 8;
  const Schedule v = make_zb_v(D, N, {});
  const Timeline tl = simulate(v, split_cost(1, 1, 1));
  const StageMemory chunk{.param = 3, .act = 2, .err_peak = 1, .deferred = 0.5};
  const MemoryReport m = memory_model(v, tl, {chunk});
  EXPECT_DOUBLE_EQ(m.params, 2 * 2 * chunk.param);
  EXPECT_DOUBLE_EQ(m.activations, 2 * N * (chunk.act + chunk.deferred));
  // The peak held is at most 2D chunks' activations and output gradients.
  EXPECT_LE(m.activations_in_flight, 2 * D * (chunk.act + chunk.deferred));
  EXPECT_GE(m.activations_in_flight, 2 * chunk.act);
}

}  // namespace
}  // namespace pf
