// The typed K-FAC profile and its wire form (runtime/plan_record.hpp): the flat vector the ranks
// all-reduce and record, and the typed fields the planner is fed from.
#include "runtime/plan_record.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"

#include <gtest/gtest.h>

namespace pf {
namespace {

Layout two_stage_layout() {
  Layout l;
  l.devices = 2;
  l.micro_batches = 2;
  l.schedule = lower_communication(make_1f1b(2, 2), {.grad_sync = false, .optimizer = true});
  l.stage_blocks = {{0, 1}, {2, 3}};  // 1 and 2 transformer blocks: Lmax = 6 * 2 + 3
  return l;
}

TEST(PlanProfile, FlattenUnflattenRoundTripsEveryField) {
  const Layout layout = two_stage_layout();
  const ProfileLayout shape(layout);
  ASSERT_EQ(shape.Lmax, 15);
  PlanProfile p = shape.empty();
  double next = 1;  // distinct values, so a field landing in another's slot shows
  for (auto& row : p.action_ms)
    for (double& x : row) x = next++;
  for (StageProfile& s : p.stages) {
    s.holders = next++, s.layers = next++, s.precondition = next++, s.sync = next++;
    for (LayerProfile& l : s.layer)
      l = {next++, next++, next++, next++, next++, next++, next++};
  }
  p.bcast_alpha = next++, p.bcast_beta = next++;
  const std::vector<double> v = shape.flatten(p);
  ASSERT_EQ(v.size(), shape.size);
  // Every slot written once: the values are exactly 1 .. size.
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], static_cast<double>(i + 1));
  // The documented offsets: device 1's actions after device 0's; a stage starts with its
  // holders and ends with its sync; alpha and beta last.
  EXPECT_EQ(v[shape.off[1]], p.action_ms[1][0]);
  EXPECT_EQ(v[shape.off[2] + shape.per_stage], p.stages[1].holders);
  EXPECT_EQ(v[shape.off[2] + 2 * shape.per_stage - 1], p.stages[1].sync);
  EXPECT_EQ(v[shape.off[2] + 3 + 2 * shape.Lmax + 4], p.stages[0].layer[4].inv_a);
  EXPECT_EQ(v[v.size() - 2], p.bcast_alpha);
  const PlanProfile q = shape.unflatten(v);
  EXPECT_EQ(q.action_ms, p.action_ms);
  EXPECT_EQ(shape.flatten(q), v);
}

TEST(PlanProfile, MeanDividesByTheHolders) {
  StageProfile s;
  s.holders = 2, s.layers = 6, s.precondition = 3, s.sync = 1;
  s.layer = {{2, 4, 6, 8, 20, 40, 2}};
  const StageProfile m = s.mean();
  EXPECT_EQ(s.layer_count(), 3);
  EXPECT_EQ(m.holders, 1);
  EXPECT_EQ(m.precondition, 1.5);
  EXPECT_EQ(m.layer[0].inv_b, 4);
  EXPECT_EQ(m.layer[0].d_out, 20);
  EXPECT_EQ(m.layer[0].diagonal_b, 1);
  StageProfile none;  // a stage nobody reported: divided by 1
  none.precondition = 5;
  EXPECT_EQ(none.mean().precondition, 5);
}

}  // namespace
}  // namespace pf
