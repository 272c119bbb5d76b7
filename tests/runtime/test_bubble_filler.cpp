// The adaptive filler's decisions (runtime/bubble_filler.hpp) on hand-made lists: which units
// float, the window each may run in, the deadlines that force them, and when a wait takes one.
#include "runtime/bubble_filler.hpp"

#include <gtest/gtest.h>

#include <vector>

using pf::Action;
using pf::BubbleFiller;
using pf::Kind;

namespace {

Action at0(Kind k, int mb = -1, int layer = -1, int stage = 0) {
  Action a;
  a.kind = k;
  a.stage = stage;
  a.micro_batch = mb;
  a.layer = layer;
  return a;
}

// Stage 0 of a 2-stage 1F1B step with one micro-batch, K-FAC units placed as a plan would:
//   0 F0  1 CURV_A(l0)  2 SEND_F0  3 RECV_B0  4 B0  5 CURV_B(l0)  6 INV_A(l0)  7 RECV_F  8 SYNC  9 INV_B  10 OPT
std::vector<Action> step_list() {
  return {at0(Kind::F, 0),         at0(Kind::CURV_A, 0, 0), at0(Kind::SEND_F, 0), at0(Kind::RECV_B, 0),
          at0(Kind::B, 0),         at0(Kind::CURV_B, 0, 0), at0(Kind::INV_A, -1, 0), at0(Kind::RECV_F, 1, -1, 0),
          at0(Kind::SYNC_CURV),    at0(Kind::INV_B, -1, 0), at0(Kind::OPT)};
}

// The unit next_for_wait hands to the wait, if any.
std::optional<size_t> pick(const BubbleFiller& f, size_t wait, int64_t waited_ns) {
  const std::optional<pf::WaitPick> p = f.next_for_wait(wait, waited_ns);
  return p ? std::optional<size_t>(p->unit) : std::nullopt;
}

}  // namespace

TEST(BubbleFiller, CurvatureAndInversionFloatInTheirWindows) {
  const std::vector<Action> list = step_list();
  BubbleFiller f;
  f.begin(list);
  EXPECT_EQ(f.units(), 4u);
  for (size_t i : {1, 5, 6, 9}) EXPECT_TRUE(f.floats(i)) << i;
  for (size_t i : {0, 2, 3, 4, 7, 8, 10}) EXPECT_FALSE(f.floats(i)) << i;
  // CURV_A reads F0's inputs and must not pass B0 (its chunk's next pass): due before action 4.
  EXPECT_EQ(f.next_due(3), std::nullopt);
  ASSERT_EQ(f.next_due(4), std::optional<size_t>(1));
  f.ran(1, 1000, false);
  EXPECT_EQ(f.next_due(7), std::nullopt);
  // CURV_B and INV_A are due at SYNC_CURV (8), in the plan's order; INV_B, after it, at the OPT (10).
  ASSERT_EQ(f.next_due(8), std::optional<size_t>(5));
  f.ran(5, 1000, false);
  ASSERT_EQ(f.next_due(8), std::optional<size_t>(6));
  f.ran(6, 1000, false);
  EXPECT_EQ(f.next_due(8), std::nullopt);
  EXPECT_EQ(f.next_due(10), std::optional<size_t>(9));
  EXPECT_EQ(f.next_due(list.size()), std::optional<size_t>(9));
}

TEST(BubbleFiller, WithoutPredictionsAWaitTakesOnlyUnitsPlannedBeforeIt) {
  const std::vector<Action> list = step_list();
  BubbleFiller f;
  f.begin(list);
  // RECV_B (3): CURV_A, planned at 1, may run there as the plan said.
  ASSERT_EQ(pick(f, 3, 0), std::optional<size_t>(1));
  f.ran(1, 1000, true);
  // Next is CURV_B: its window opens after B0 (4), so not in the wait at 3.
  EXPECT_EQ(pick(f, 3, 0), std::nullopt);
  f.waited(3, 5000, true);
  EXPECT_EQ(f.stats().in_wait, 1);
  EXPECT_EQ(f.stats().waits_filled, 1);
  // CURV_B at its deadline, then at RECV_F (7) INV_A (planned at 6, before it) without a prediction.
  f.ran(5, 1000, false);
  EXPECT_EQ(pick(f, 7, 0), std::optional<size_t>(6));
  EXPECT_EQ(f.stats().at_deadline, 1);
}

TEST(BubbleFiller, PredictionsDecideWhatFitsAWait) {
  const std::vector<Action> list = step_list();
  BubbleFiller f;
  // Step 1: every unit runs once (timings recorded), the wait at 3 measured at 10 us.
  f.begin(list);
  f.ran(1, 4000, true);   // CURV_A: 4 us
  f.waited(3, 10000, true);
  f.ran(5, 2000, false);  // CURV_B
  f.ran(6, 8000, false);  // INV_A: 8 us
  f.waited(7, 3000, false);
  f.ran(9, 1000, false);  // INV_B
  // Step 2: CURV_A fits 10 us from the start, not 7 us into the wait (7 + 4 * 1.05 > 10); it
  // starts there all the same, as this is its last wait before B0, which it would delay by all of it.
  f.begin(list);
  EXPECT_EQ(pick(f, 3, 0), std::optional<size_t>(1));
  EXPECT_EQ(pick(f, 3, 7000), std::optional<size_t>(1));
  f.ran(1, 4000, false);
  f.ran(5, 2000, false);
  // INV_A (8 us) does not fit the 3 us wait at 7, though the plan put it before.
  EXPECT_EQ(pick(f, 7, 0), std::nullopt);
  // A long wait there now (averaged: 3 + 0.5 * (40 - 3) = 21.5 us) takes it.
  f.waited(7, 40000, false);
  f.ran(6, 8000, false);
  f.ran(9, 1000, false);
  f.begin(list);
  f.ran(1, 4000, true);
  f.ran(5, 2000, true);
  EXPECT_EQ(pick(f, 7, 0), std::optional<size_t>(6));
  EXPECT_EQ(pick(f, 7, 14000), std::nullopt);  // 14 + 8.4 > 21.5
}

// An inversion whose window opens at the step's start may be pulled into an earlier wait than
// the plan's, once predictions say it fits.
TEST(BubbleFiller, AnInversionRunsInAnEarlierWaitWhenItFits) {
  // 0 RECV_F0  1 F0  2 SEND_F0  3 RECV_B0  4 B0  5 INV_A(l0)  6 OPT
  const std::vector<Action> list = {at0(Kind::RECV_F, 0), at0(Kind::F, 0),  at0(Kind::SEND_F, 0), at0(Kind::RECV_B, 0),
                                    at0(Kind::B, 0),      at0(Kind::INV_A, -1, 0), at0(Kind::OPT)};
  BubbleFiller f;
  f.begin(list);
  EXPECT_EQ(pick(f, 0, 0), std::nullopt);  // no prediction: not before its planned place
  f.waited(0, 50000, false);
  f.waited(3, 0, false);
  f.ran(5, 5000, false);  // at its deadline, the OPT
  f.begin(list);
  EXPECT_EQ(pick(f, 0, 0), std::optional<size_t>(5));
  EXPECT_EQ(f.next_due(6), std::optional<size_t>(5));
}

// A ready unit that fits a wait passes one that does not, unless they are of one layer: a layer's
// units keep the plan's order (its factors' sums, its inversions' damping).
TEST(BubbleFiller, AUnitThatFitsPassesOneThatDoesNotExceptInItsLayer) {
  // 0 RECV_F0  1 F0  2 SEND_F0  3 RECV_B0  4 B0  5 INV_A(l0)  6 INV_B(l0)  7 INV_A(l1)  8 OPT
  const std::vector<Action> list = {at0(Kind::RECV_F, 0),    at0(Kind::F, 0),           at0(Kind::SEND_F, 0),
                                    at0(Kind::RECV_B, 0),    at0(Kind::B, 0),           at0(Kind::INV_A, -1, 0),
                                    at0(Kind::INV_B, -1, 0), at0(Kind::INV_A, -1, 1), at0(Kind::OPT)};
  BubbleFiller f;
  f.begin(list);
  f.waited(0, 10000, false);  // a 10 us wait
  f.waited(3, 0, false);
  f.ran(5, 20000, false);     // INV_A(l0): 20 us, never fits
  f.ran(6, 2000, false);
  f.ran(7, 3000, false);
  f.begin(list);
  // INV_A(l0) does not fit; INV_B(l0) would, but must follow it; INV_A(l1) fits and runs first.
  ASSERT_EQ(pick(f, 0, 0), std::optional<size_t>(7));
  f.ran(7, 3000, true);
  EXPECT_EQ(pick(f, 0, 3000), std::nullopt);
  ASSERT_EQ(f.next_due(8), std::optional<size_t>(5));
  f.ran(5, 20000, false);
  EXPECT_EQ(f.next_due(8), std::optional<size_t>(6));
  // With INV_A(l0) done, INV_B(l0) is ready for a wait.
  EXPECT_EQ(pick(f, 3, 0), std::nullopt);  // RECV_B0's wait measured 0 us
  f.ran(6, 2000, false);
  EXPECT_EQ(f.next_due(list.size()), std::nullopt);
  EXPECT_EQ(f.stats().in_wait, 1);
  EXPECT_EQ(f.stats().at_deadline, 5);
}

// A unit whose own window closes late is due where a later unit of its layer must run: an
// inversion of the last cycle's factors planned before the new cycle's curvature of that layer.
TEST(BubbleFiller, AUnitIsDueNoLaterThanItsLayersLaterUnits) {
  // 0 F0  1 INV_A(l0)  2 CURV_A(l0, mb 0)  3 B0  4 OPT
  const std::vector<Action> list = {at0(Kind::F, 0), at0(Kind::INV_A, -1, 0), at0(Kind::CURV_A, 0, 0), at0(Kind::B, 0),
                                    at0(Kind::OPT)};
  BubbleFiller f;
  f.begin(list);
  EXPECT_EQ(f.next_due(2), std::nullopt);
  ASSERT_EQ(f.next_due(3), std::optional<size_t>(1));  // INV_A's own window closes at the OPT (4)
  f.ran(1, 1000, false);
  EXPECT_EQ(f.next_due(3), std::optional<size_t>(2));
}

// A curvature unit due before a pass that fits no wait starts in the last wait of its window,
// after the units that fit there: it delays the pass only by its overrun. A unit due at the OPT
// keeps its deadline.
TEST(BubbleFiller, AUnitDueBeforeAPassTakesItsLastWait) {
  // 0 RECV_F0  1 F0  2 CURV_A(l0, mb 0)  3 CURV_A(l1, mb 0)  4 RECV_F1  5 F1  6 INV_A(l2)  7 OPT
  const std::vector<Action> list = {at0(Kind::RECV_F, 0),    at0(Kind::F, 0), at0(Kind::CURV_A, 0, 0),
                                    at0(Kind::CURV_A, 0, 1), at0(Kind::RECV_F, 1), at0(Kind::F, 1),
                                    at0(Kind::INV_A, -1, 2), at0(Kind::OPT)};
  BubbleFiller f;
  f.begin(list);
  f.waited(0, 50000, false);
  f.ran(2, 8000, false);  // 8 us: never fits the 4 us wait at 4
  f.ran(3, 2000, false);
  f.waited(4, 4000, false);
  f.ran(6, 30000, false);
  f.begin(list);
  ASSERT_EQ(pick(f, 4, 0), std::optional<size_t>(3));  // the unit that fits first
  f.ran(3, 2000, true);
  const std::optional<pf::WaitPick> last = f.next_for_wait(4, 2000);  // then the last chance before F1
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->unit, 2u);
  EXPECT_FALSE(last->fits);
  f.ran(2, 8000, true);
  EXPECT_EQ(pick(f, 4, 10000), std::nullopt);  // INV_A(l2), due at the OPT, does not start here
  // The message came during that unit, 2 us in: a bound below the 4 us predicted leaves the
  // prediction, so CURV_A(l1) still fits next step; one above it raises it.
  f.waited(4, 2000, true, true);
  f.ran(6, 30000, false);
  f.begin(list);
  EXPECT_EQ(pick(f, 4, 1500), std::optional<size_t>(3));  // 1.5 + 2.1 <= 4
  f.ran(3, 2000, true);
  f.ran(2, 8000, true);
  f.waited(4, 12000, true, true);  // averaged: 8 us
  f.ran(6, 30000, false);
  f.begin(list);
  ASSERT_EQ(pick(f, 4, 0), std::optional<size_t>(3));
  f.ran(3, 2000, true);
  EXPECT_EQ(pick(f, 4, 2000), std::optional<size_t>(2));  // 2 + 8.4 > 8: still its best wait, not a fit
  EXPECT_FALSE(f.next_for_wait(4, 2000)->fits);
}

// A unit with more room in a later wait of its window waits for it.
TEST(BubbleFiller, AUnitWithRoomInALaterWaitWaitsForIt) {
  // 0 F0  1 CURV_A(l0, mb 0)  2 RECV_F1  3 RECV_B0  4 B0  5 OPT
  const std::vector<Action> list = {at0(Kind::F, 0),      at0(Kind::CURV_A, 0, 0), at0(Kind::RECV_F, 1),
                                    at0(Kind::RECV_B, 0), at0(Kind::B, 0),         at0(Kind::OPT)};
  BubbleFiller f;
  f.begin(list);
  f.ran(1, 8000, false);
  f.waited(2, 4000, false);
  f.waited(3, 20000, false);
  f.begin(list);
  EXPECT_EQ(pick(f, 2, 0), std::nullopt);  // 8.4 us > 4 us, and RECV_B0's 20 us hold it
  EXPECT_EQ(pick(f, 3, 0), std::optional<size_t>(1));
  // Neither wait holds it now: it starts in the one with more room (RECV_B0's 5 us, not 4 us).
  f.ran(1, 8000, true);
  f.waited(3, 0, false);  // averaged: 10 us
  f.waited(3, 0, false);  // 5 us
  f.begin(list);
  EXPECT_EQ(pick(f, 2, 0), std::nullopt);
  EXPECT_EQ(pick(f, 3, 0), std::optional<size_t>(1));
  // RECV_B0 at 2 us: the first wait is the better one.
  f.ran(1, 8000, true);
  f.waited(3, 0, false);  // 2.5 us
  f.begin(list);
  EXPECT_EQ(pick(f, 2, 0), std::optional<size_t>(1));
}
