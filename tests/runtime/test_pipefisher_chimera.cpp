// PipeFisher with Chimera: twins (and replicas) sum their curvature and share their inversions,
// and the weights still equal single-process K-FAC following the refresh record.
#include "pipefisher_fixture.hpp"
#include "schedule/action.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>

using namespace pf_test::pipefisher;

// Chimera: the twins of a stage (devices i and D-1-i) sum their curvature at SYNC_CURVs pinned
// at the end of one cycle step, so both refresh from the same step's micro-batches (all of them,
// as the single process) and switch inverses at the same step.
TEST(PipeFisherRuntime, BubblesWithChimeraEqualSingleProcessWithSamePattern) {
  // Chimera on 2 devices has almost no bubble: measured timings, even scaled down, gave cycles
  // longer than the run on a loaded machine, so it plans from made-up timings (made_up_profile).
  // Inverses refreshed in cycle c are in use from the sync of cycle c+1: 16 steps.
  const std::string sets2 = "--set parallel.stages=2 --set parallel.schedule=chimera --set train.steps=16";
  const fs::path made_up = made_up_plan_profile("chimera_2", sets2, 2);
  expect_bubbles_match("chimera_2", 2, sets2 + " --set kfac.plan_profile=" + made_up.string(), {"train.steps=16"},
                       "--test-bcast-model 0,0");
  const std::string sets4 = "--set parallel.stages=4 --set parallel.schedule=chimera --set train.steps=16";
  expect_bubbles_match("chimera_4", 4, sets4 + " --set kfac.plan_profile=" + made_up_plan_profile("chimera_4", sets4, 4).string(),
                       {"train.steps=16"});
}

namespace {

// Inversion parallelism across Chimera's twins (and replicas): which rank ran which inversion
// piece and which broadcast, from the runtime's trace (--profile-dir's trace.json: every profiled
// step's actions as they ran; steps 1-2 profile inline and are left out). Key: (stage, side,
// layer, block) of the stage group's piece; both pipelines' copies of a stage name the same piece.
struct Shares {
  std::map<std::tuple<int, int, int, int>, std::set<int>> inv, bcast;  // piece -> ranks
};
Shares shares_in_trace(const fs::path& profile_dir) {
  Shares sh;
  std::ifstream in(profile_dir / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || !e.contains("args") || !e["args"].contains("action") || e["args"]["step"].get<int>() <= 2)
      continue;
    const pf::Action a = pf::parse_token(e["args"]["action"].get<std::string>(), "trace.json");
    const bool inv = a.kind == pf::Kind::INV_A || a.kind == pf::Kind::INV_B;
    const bool bcast = a.kind == pf::Kind::BCAST_INV_A || a.kind == pf::Kind::BCAST_INV_B;
    if (!inv && !bcast) continue;
    const int side = a.kind == pf::Kind::INV_A || a.kind == pf::Kind::BCAST_INV_A ? 0 : 1;
    (inv ? sh.inv : sh.bcast)[{a.stage, side, a.layer, a.block}].insert(e["pid"].get<int>());
  }
  return sh;
}

// With a zero broadcast cost every piece is CT: each is inverted by one holder of its stage
// group and broadcast to all `holders` of it; the pieces inverted cover every factor of every
// stage (the plan's count), and each holder inverts only its share.
void expect_shared_inversions(const Shares& sh, const std::string& out, size_t holders, const std::string& what) {
  const auto at = out.find("inversion pieces:");
  ASSERT_NE(at, std::string::npos) << out;
  int ct = -1, nct = -1;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "inversion pieces: %d broadcast, %d", &ct, &nct), 2) << out;
  EXPECT_EQ(nct, 0) << out;
  EXPECT_EQ(sh.inv.size(), static_cast<size_t>(ct)) << what << ": every piece of every stage inverted";
  std::map<int, std::set<int>> group;                // stage -> ranks that broadcast its pieces
  std::map<std::pair<int, int>, int> inverted;       // (stage, rank) -> pieces it inverted
  for (const auto& [piece, ranks] : sh.inv) {
    EXPECT_EQ(ranks.size(), 1u) << what << ": stage " << std::get<0>(piece) << " layer " << std::get<2>(piece)
                                << " side " << std::get<1>(piece) << " inverted by more than one holder";
    ++inverted[{std::get<0>(piece), *ranks.begin()}];
  }
  for (const auto& [piece, ranks] : sh.bcast) {
    EXPECT_EQ(ranks.size(), holders) << what << ": a broadcast every holder of the stage joins";
    EXPECT_TRUE(sh.inv.count(piece)) << what << ": a broadcast piece nobody inverted";
    group[std::get<0>(piece)].insert(ranks.begin(), ranks.end());
  }
  for (const auto& [piece, ranks] : sh.inv) EXPECT_TRUE(sh.bcast.count(piece)) << what << ": an inverse never broadcast";
  // Each holder inverts a share, not the stage's whole set.
  for (const auto& [stage, ranks] : group)
    for (int r : ranks) {
      int total = 0;
      for (const auto& [piece, x] : sh.inv) total += std::get<0>(piece) == stage;
      const int mine = inverted[std::pair(stage, r)];
      EXPECT_GT(mine, 0) << what << ": rank " << r << " inverts none of stage " << stage;
      EXPECT_LT(mine, total) << what << ": rank " << r << " inverts all of stage " << stage;
    }
}

}  // namespace

// Chimera on 4 devices: twins 0/3 and 1/2 each share their two stages' inversions (Algorithm 1
// over the 2 holders), each pair with its own cycle; the weights still equal single-process
// K-FAC following the refresh record.
TEST(PipeFisherRuntime, BubblesWithChimeraTwinsShareInversions) {
  // Planned from made-up timings (made_up_profile): the plan, hence which holder inverts which
  // piece and when, is the same on any machine; measured ones under load gave cycles too long
  // for every piece to be inverted within the run.
  const std::string sets = "--set parallel.stages=4 --set parallel.schedule=chimera --set train.steps=16";
  const fs::path made_up = made_up_plan_profile("chimera_4_share", sets, 4);
  std::string out;
  const fs::path prof = dir() / "chimera_4_share_profile";
  fs::remove_all(prof);
  expect_bubbles_match("chimera_4_share", 4,
                       sets + " --set kfac.plan_profile=" + made_up.string() + " --profile-dir " + prof.string(),
                       {"train.steps=16"}, "--test-bcast-model 0,0", &out);
  expect_shared_inversions(shares_in_trace(prof), out, 2, "chimera_4_share");
}

// 2 stages x 2 replicas: each stage has 4 holders (2 twins x 2 replicas); the replicas of a
// device share its inversions out, each pipeline's holders together invert every piece once.
// Each stage's group is 2 twins x 2 replicas; with a zero broadcast cost each of the 4 inverts
// its share and every piece is broadcast to all 4.
TEST(PipeFisherRuntime, BubblesWithChimeraAndReplicasEqualSingleProcessWithSamePattern) {
  // Planned from made-up timings (made_up_profile), as BubblesWithChimeraTwinsShareInversions:
  // measured ones of 4 ranks on 2 loaded cores once planned a 51-step refresh, so no inverse of
  // the plan's cycles was built within the run.
  const std::string sets =
      "--set parallel.stages=2 --set parallel.schedule=chimera --set parallel.data_parallel=2 --set train.steps=16";
  const fs::path made_up = made_up_plan_profile("chimera_2x2", sets, 4);
  std::string out;
  const fs::path prof = dir() / "chimera_2x2_profile";
  fs::remove_all(prof);
  expect_bubbles_match("chimera_2x2", 4,
                       sets + " --set kfac.plan_profile=" + made_up.string() + " --profile-dir " + prof.string(),
                       {"parallel.data_parallel=2", "train.steps=16"}, "--test-bcast-model 0,0", &out);
  expect_shared_inversions(shares_in_trace(prof), out, 4, "chimera_2x2");
}
