// The planners of data-parallel K-FAC, on hand-computed cases: Algorithm 1's exact greedy
// assignments (as KAISA's tests assert theirs), round-robin, the tensor-fusion rule of Eq. 15,
// the threshold fusion, and the least-squares fits of the performance models.
#include "comm/perf_model.hpp"
#include "dkfac/fusion.hpp"
#include "kfac/placement.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pf {
namespace {

constexpr int E = kEveryRank;

// Costs in made-up units: inverting d costs d, broadcasting costs 150 whatever d.
double inv_d(int64_t d) { return static_cast<double>(d); }
double bcast_150(int64_t) { return 150.0; }

TEST(Placement, LoadBalancedHandComputed) {
  // Descending: 400 (#1), 300 (#3), 200 (#2), 100 (#0), 50 (#4).
  //   400: 400 >= 150 -> CT, loads (0, 0) -> rank 0, load0 = 550
  //   300: CT -> rank 1, load1 = 450
  //   200: CT -> rank 1 (450 < 550), load1 = 800
  //   100: 100 < 150 -> NCT, loads (650, 900);  50: NCT, loads (700, 950)
  const InversionPlacement p = place_load_balanced({100, 400, 200, 300, 50}, 2, inv_d, bcast_150);
  EXPECT_EQ(p.owner, (std::vector<int>{E, 0, 1, 1, E}));
  EXPECT_EQ(p.order, (std::vector<int>{1, 3, 2, 0, 4}));
  EXPECT_EQ(p.load, (std::vector<double>{700, 950}));
  EXPECT_EQ(p.communicated(), 3);
  EXPECT_EQ(p.makespan(), 950);
  EXPECT_EQ(p.inverted_by(0), (std::vector<int>{1, 0, 4}));
  EXPECT_EQ(p.inverted_by(1), (std::vector<int>{3, 2, 0, 4}));
}

TEST(Placement, LoadBalancedFourRanksTiesGoToTheLowestRank) {
  // Five equal CTs over 4 ranks: 0, 1, 2, 3 (ties by rank index), then rank 0 again; the stable
  // sort keeps the factor order for equal dimensions.
  const InversionPlacement p =
      place_load_balanced({500, 500, 500, 500, 500}, 4, inv_d, [](int64_t) { return 10.0; });
  EXPECT_EQ(p.owner, (std::vector<int>{0, 1, 2, 3, 0}));
  EXPECT_EQ(p.load, (std::vector<double>{1020, 510, 510, 510}));
}

TEST(Placement, TheCostModelsDecideNotTheDimension) {
  // The same dimensions; a slow broadcast makes everything non-communicated, a free one
  // (comp == comm is not "cheaper": it stays communicated) spreads them.
  const std::vector<int64_t> dims = {256, 1024, 512};
  const InversionPlacement slow = place_load_balanced(dims, 2, inv_d, [](int64_t) { return 1e9; });
  EXPECT_EQ(slow.owner, (std::vector<int>{E, E, E}));
  EXPECT_EQ(slow.load, (std::vector<double>{1792, 1792}));
  // Broadcast equal to the inversion: CT (not strictly cheaper to invert everywhere).
  const InversionPlacement eq = place_load_balanced(dims, 2, inv_d, inv_d);
  EXPECT_EQ(eq.owner, (std::vector<int>{1, 0, 1}));  // 1024 -> 0 (2048), 512 -> 1 (1024), 256 -> 1 (1536)
  EXPECT_EQ(eq.load, (std::vector<double>{2048, 1536}));
  // The same sizes with a cubic inversion model: the balance follows d^3, not d.
  const InversionPlacement cubic =
      place_load_balanced({1024, 512, 512, 512, 512, 512, 512, 512, 512}, 2,
                          [](int64_t d) { return static_cast<double>(d) * d * d; }, [](int64_t) { return 0.0; });
  // 1024^3 = 8 u (u = 512^3): rank 0 takes it (8u); the eight 512s then all go to rank 1, whose
  // load is below 8u until the eighth is placed. By dimension alone (load += d) rank 1 would stop
  // at two (1024 = 2 x 512).
  EXPECT_EQ(cubic.owner, (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(Placement, SingleRankInvertsEverythingItself) {
  const InversionPlacement p = place_load_balanced({10, 20}, 1, inv_d, [](int64_t) { return 0.0; });
  EXPECT_EQ(p.owner, (std::vector<int>{E, E}));
  EXPECT_EQ(p.load, (std::vector<double>{30}));
}

TEST(Placement, RoundRobinIsEq22) {
  const InversionPlacement p = place_round_robin({100, 400, 200, 300, 50}, 2, inv_d, bcast_150);
  EXPECT_EQ(p.owner, (std::vector<int>{0, 1, 0, 1, 0}));
  EXPECT_EQ(p.order, (std::vector<int>{0, 1, 2, 3, 4}));
  // rank 0: 100 + 200 + 50 + 3 x 150 = 800; rank 1: 400 + 300 + 2 x 150 = 1000
  EXPECT_EQ(p.load, (std::vector<double>{800, 1000}));
  // ... which Algorithm 1 beats on the same models (950 above).
  EXPECT_LT(place_load_balanced({100, 400, 200, 300, 50}, 2, inv_d, bcast_150).makespan(), p.makespan());
  // By layer: factors (A, B) of layers 0, 0, 1, 1, 2 on ranks 0, 0, 1, 1, 0 (with W = 2 by index
  // every A would land on rank 0 and every B on rank 1).
  const InversionPlacement by_layer = place_round_robin({100, 400, 200, 300, 50}, 2, inv_d, bcast_150, {0, 0, 1, 1, 2});
  EXPECT_EQ(by_layer.owner, (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(by_layer.load, (std::vector<double>{100 + 400 + 50 + 3 * 150, 200 + 300 + 2 * 150}));
}

TEST(Fusion, Eq15HandComputed) {
  // alpha = 1, beta = 0.1 per float, 10 floats each:
  //   g0 = {0} begins 0; #1 ready 0.5 < 0 + 1 -> joins, begins 0.5
  //   #2 ready 3 >= 0.5 + 1 -> g0 closes: end 0.5 + 1 + 0.1 x 20 = 3.5; g1 = {2} begins max(3, 3.5) = 3.5
  //   #3 ready 3.2 < 3.5 + 1 -> joins, begins max(3.2, 3.5) = 3.5
  //   #4 ready 10 >= 4.5 -> g1 closes: end 3.5 + 1 + 2 = 6.5; g2 = {4} begins 10, ends 10 + 1 + 1 = 12
  const auto g = plan_fusion({0, 0.5, 3, 3.2, 10}, {10, 10, 10, 10, 10}, {1.0, 0.1});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].first, 0);
  EXPECT_EQ(g[0].last, 1);
  EXPECT_DOUBLE_EQ(g[0].begin, 0.5);
  EXPECT_DOUBLE_EQ(g[0].end, 3.5);
  EXPECT_EQ(g[1].first, 2);
  EXPECT_EQ(g[1].last, 3);
  EXPECT_DOUBLE_EQ(g[1].begin, 3.5);
  EXPECT_DOUBLE_EQ(g[1].end, 6.5);
  EXPECT_EQ(g[2].first, 4);
  EXPECT_EQ(g[2].last, 4);
  EXPECT_DOUBLE_EQ(g[2].begin, 10);
  EXPECT_DOUBLE_EQ(g[2].end, 12);
}

TEST(Fusion, ABacklogMergesEvenWithoutStartUpCost) {
  // alpha = 0, beta = 1: #0 (5 floats) runs 0..5; #1 ready at 1 could only begin at 5, so #2
  // (ready 2 < 5) joins it rather than queue behind it.
  const auto g = plan_fusion({0, 1, 2}, {5, 1, 1}, {0.0, 1.0});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].last, 0);
  EXPECT_DOUBLE_EQ(g[0].end, 5);
  EXPECT_EQ(g[1].first, 1);
  EXPECT_EQ(g[1].last, 2);
  EXPECT_DOUBLE_EQ(g[1].begin, 5);
  EXPECT_DOUBLE_EQ(g[1].end, 7);
}

TEST(Fusion, FarApartFactorsTravelAlone) {
  const auto g = plan_fusion({0, 10, 20}, {1, 1, 1}, {1.0, 0.0});
  ASSERT_EQ(g.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(g[k].first, k);
    EXPECT_EQ(g[k].last, k);
  }
  EXPECT_TRUE(plan_fusion({}, {}, {1.0, 0.0}).empty());
}

TEST(Fusion, ThresholdGroups) {
  const auto g = plan_threshold({3, 3, 3, 10, 1}, 6);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].first, 0);
  EXPECT_EQ(g[0].last, 1);
  EXPECT_EQ(g[1].first, 2);
  EXPECT_EQ(g[1].last, 2);
  EXPECT_EQ(g[2].first, 3);  // larger than the threshold: alone
  EXPECT_EQ(g[3].first, 4);
}

TEST(PerfModel, LeastSquaresFits) {
  const comm::LinearCost l = comm::fit_linear({1, 2, 4, 8}, {5, 8, 14, 26});  // 2 + 3x
  EXPECT_NEAR(l.alpha, 2, 1e-12);
  EXPECT_NEAR(l.beta, 3, 1e-12);
  // Noisy points: the closed-form least squares of (0,1), (1,2), (2,2): beta 0.5, alpha 7/6.
  const comm::LinearCost n = comm::fit_linear({0, 1, 2}, {1, 2, 2});
  EXPECT_NEAR(n.beta, 0.5, 1e-12);
  EXPECT_NEAR(n.alpha, 7.0 / 6.0, 1e-12);
  // A line whose intercept would be negative: the least squares through the origin instead,
  // sum(xy) / sum(x^2) = (1*1 + 2*4 + 3*7) / 14 = 30/14 (the free fit: -2 + 3x).
  const comm::LinearCost o = comm::fit_linear({1, 2, 3}, {1, 4, 7});
  EXPECT_EQ(o.alpha, 0);
  EXPECT_NEAR(o.beta, 30.0 / 14.0, 1e-12);
  const comm::LinearCost one = comm::fit_linear({3, 3}, {1, 2});  // no spread: the mean
  EXPECT_EQ(one.alpha, 1.5);
  EXPECT_EQ(one.beta, 0);
  std::vector<double> d = {64, 128, 256, 512}, t;
  for (double x : d) t.push_back(2e-10 * x * x * x + 1e-5);
  const comm::CubicCost c = comm::fit_cubic(d, t);
  EXPECT_NEAR(c.c, 2e-10, 1e-20);
  EXPECT_NEAR(c.e, 1e-5, 1e-12);
}

TEST(PerfModel, JsonRoundTripAndKey) {
  comm::PerfModel m;
  m.key = "host-cpu-w2-t1";
  m.allreduce = {1e-5, 2e-9};
  m.broadcast = {3e-5, 4e-9};
  m.inversion = {5e-11, 6e-6};
  const comm::PerfModel r = comm::perf_model_from_json(comm::perf_model_to_json(m));
  EXPECT_EQ(r.key, m.key);
  EXPECT_EQ(r.allreduce.alpha, 1e-5);
  EXPECT_EQ(r.broadcast.beta, 4e-9);
  EXPECT_EQ(r.inversion.c, 5e-11);
  EXPECT_EQ(r.inversion.e, 6e-6);
  EXPECT_DOUBLE_EQ(r.broadcast_sym(3), 3e-5 + 4e-9 * 6);
  EXPECT_THROW(comm::perf_model_from_json("{\"key\": 1}"), std::exception);
  const std::string k = comm::machine_key(4, 1);
  EXPECT_EQ(k.substr(k.size() - 6), "-w4-t1");
  EXPECT_EQ(k.find(' '), std::string::npos);
  EXPECT_EQ(k.find('/'), std::string::npos);
}

}  // namespace
}  // namespace pf
