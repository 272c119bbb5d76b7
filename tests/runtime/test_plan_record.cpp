// The PipeFisher profile in the runtime (runtime/plan_record.hpp): the wire form the ranks
// all-reduce, the typed profile the planner is fed from, and its record, the profile JSON.
#include "core/error.hpp"
#include "runtime/plan_record.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace pf {
namespace {

Layout two_stage_layout(int replicas = 1) {
  Layout l;
  l.devices = 2;
  l.replicas = replicas;
  l.micro_batches = 2;
  l.schedule = lower_communication(make_1f1b(2, 2), {.grad_sync = false, .optimizer = true});
  l.stage_blocks = {{0, 1}, {2, 3}};  // 1 and 2 transformer blocks: Lmax = 6 * 2 + 3
  return l;
}

// Distinct values in every field (a field landing in another's slot shows), `layers` per stage;
// doubles that need all 17 digits, so that a lossy round trip shows.
PlanProfile distinct_profile(const Layout& layout, int layers) {
  PlanProfile p;
  double next = 1;
  auto value = [&next] { return next++ + 1.0 / 3; };
  for (int d = 0; d < layout.devices; ++d) {
    p.action_ms.emplace_back();
    for (size_t i = 0; i < layout.schedule.per_device[d].size(); ++i) p.action_ms.back().push_back(value());
  }
  for (int s = 0; s < layout.stages(); ++s) {
    StageKfacCost c;
    c.precondition = value(), c.sync = value();
    for (int l = 0; l < layers; ++l) {
      c.curv_a.push_back(value()), c.curv_b.push_back(value()), c.inv_a.push_back(value()), c.inv_b.push_back(value());
      c.dim_a.push_back(static_cast<int>(next++)), c.dim_b.push_back(static_cast<int>(next++));
      c.diag_b.push_back(l % 2);
    }
    p.kfac.push_back(c);
  }
  p.bcast_alpha = value(), p.bcast_beta = value();
  return p;
}

TEST(PlanProfile, WireRoundTripsEveryFieldAtItsOffset) {
  const Layout layout = two_stage_layout(2);  // replicas: a broadcast model, over 4 ranks
  const ProfileLayout wire(layout);
  ASSERT_EQ(wire.Lmax, 15);
  ASSERT_TRUE(wire.broadcast);
  const PlanProfile p = distinct_profile(layout, wire.Lmax);
  std::vector<double> v = wire.zeros();
  ASSERT_EQ(v.size(), wire.size);
  for (int d = 0; d < layout.devices; ++d) wire.set_actions(v, d, p.action_ms[d]);
  for (int s = 0; s < layout.stages(); ++s) wire.add_stage(v, s, p.kfac[s]);
  wire.add_broadcast(v, p.bcast_alpha, p.bcast_beta);
  // The documented offsets: device 1's actions after device 0's; a stage starts with its
  // holders and ends with its sync; alpha and beta last.
  EXPECT_EQ(v[wire.off[1]], p.action_ms[1][0]);
  EXPECT_EQ(v[wire.off[2] + wire.per_stage], 1);
  EXPECT_EQ(v[wire.off[2] + wire.per_stage + 1], wire.Lmax);
  EXPECT_EQ(v[wire.off[2] + 2 * wire.per_stage - 1], p.kfac[1].sync);
  EXPECT_EQ(v[wire.off[2] + 3 + 2 * wire.Lmax + 4], p.kfac[0].inv_a[4]);
  EXPECT_EQ(v[v.size() - 2], p.bcast_alpha);
  // One holder per stage: the mean is every field as added; the broadcast model over the ranks.
  PlanProfile q = wire.mean(v);
  EXPECT_EQ(q.bcast_alpha, p.bcast_alpha / 4);
  EXPECT_EQ(q.bcast_beta, p.bcast_beta / 4);
  q.bcast_alpha = p.bcast_alpha, q.bcast_beta = p.bcast_beta;
  EXPECT_TRUE(q == p);
}

TEST(PlanProfile, MeanDividesByTheHolders) {
  const Layout layout = two_stage_layout();
  const ProfileLayout wire(layout);
  EXPECT_FALSE(wire.broadcast);
  StageKfacCost a, b;
  a.precondition = 1, b.precondition = 2;
  for (StageKfacCost* c : {&a, &b})
    for (int l = 0; l < 3; ++l)
      c->curv_a.push_back(1), c->curv_b.push_back(1), c->inv_a.push_back(1), c->inv_b.push_back(c == &a ? 3 : 5),
          c->dim_a.push_back(10), c->dim_b.push_back(20), c->diag_b.push_back(1);
  std::vector<double> v = wire.zeros();
  wire.add_stage(v, 0, a);
  wire.add_stage(v, 0, b);
  v[wire.off.back() + wire.per_stage + 2] = 5;  // stage 1's precondition, reported by nobody: divided by 1
  const PlanProfile m = wire.mean(v);
  EXPECT_EQ(m.kfac[0].layers(), 3);
  EXPECT_EQ(m.kfac[0].precondition, 1.5);
  EXPECT_EQ(m.kfac[0].inv_b[0], 4);
  EXPECT_EQ(m.kfac[0].dim_b[0], 20);
  EXPECT_EQ(m.kfac[0].diag_b[0], 1);
  EXPECT_EQ(m.kfac[1].precondition, 5);
  EXPECT_EQ(m.kfac[1].layers(), 0);
  EXPECT_LT(m.bcast_alpha, 0);  // one pipeline, one replica: no broadcast model
}

// The record is a profile JSON that reads back bit for bit: kfac.plan_profile plans from exactly
// the numbers the recording run planned from. Its stages' forward/backward are the action means.
TEST(PlanProfile, RecordIsAProfileThatReadsBackExactly) {
  Config cfg;
  const Layout layout = two_stage_layout(2);
  PlanProfile p = distinct_profile(layout, 9);
  p.shape = plan_shape(cfg, layout);
  const nlohmann::json j = plan_profile_json(cfg, layout, p);
  EXPECT_EQ(j["format"], "pipefisher-profile");
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "pf_plan_record_test.json";
  std::ofstream(path) << j.dump(1);
  const Profile read = read_profile_json(path.string());
  EXPECT_TRUE(read.plan == p);
  ASSERT_EQ(read.cost.stages.size(), 2u);
  EXPECT_GT(read.cost.stages[1].forward, 0);
  ASSERT_TRUE(read.run.has_value());
  EXPECT_EQ(read.run->replicas, 2);
  cfg.kfac.plan_profile = path.string();
  EXPECT_TRUE(read_plan_profile(cfg, layout) == p);
  // Another shape is refused naming the key.
  cfg.model.hidden *= 2;
  try {
    read_plan_profile(cfg, layout);
    ADD_FAILURE() << "another shape was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("kfac.plan_profile: '" + path.string() + "' was recorded for"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

// SOAP's profile (per rotated weight its two refreshes and its statistics, no K-FAC unit) reads back
// bit for bit as "soap_weights"; a SOAP run refuses a K-FAC profile and a K-FAC run a SOAP one,
// naming the key, as the two optimizers' units are not each other's.
TEST(PlanProfile, SoapProfileReadsBackExactlyAndOnlyForSoap) {
  Config cfg;
  cfg.optim.name = OptimName::Soap;
  const Layout layout = two_stage_layout();
  PlanProfile p = distinct_profile(layout, 3);
  for (size_t s = 0; s < p.kfac.size(); ++s) {
    StageKfacCost c;
    for (int w = 0; w < 4; ++w) {
      c.eig_l.push_back(1.5 + w + 10 * s);
      c.eig_r.push_back(0.25 * (w + 1) + s);
      c.statistics.push_back(0.125 + w / 3.0);
    }
    p.kfac[s] = c;
  }
  p.bcast_alpha = p.bcast_beta = -1;
  p.shape = plan_shape(cfg, layout);
  const nlohmann::json j = plan_profile_json(cfg, layout, p);
  EXPECT_TRUE(j["stages"][0].contains("soap_weights"));
  EXPECT_FALSE(j["stages"][0].contains("kfac_layers"));
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "pf_plan_record_soap_test.json";
  std::ofstream(path) << j.dump(1);
  cfg.kfac.plan_profile = path.string();
  EXPECT_TRUE(read_plan_profile(cfg, layout) == p);
  cfg.optim.name = OptimName::NvLamb;
  cfg.kfac.enabled = true;
  try {
    read_plan_profile(cfg, layout);
    ADD_FAILURE() << "a K-FAC run took SOAP's profile";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("kfac.plan_profile: '" + path.string() + "' holds SOAP's units"), std::string::npos)
        << e.what();
  }
  // And a K-FAC profile for a SOAP run.
  PlanProfile k = distinct_profile(layout, 3);
  k.bcast_alpha = k.bcast_beta = -1;
  k.shape = plan_shape(cfg, layout);
  std::ofstream(path) << plan_profile_json(cfg, layout, k).dump(1);
  cfg.optim.name = OptimName::Soap;
  cfg.kfac.enabled = false;
  try {
    read_plan_profile(cfg, layout);
    ADD_FAILURE() << "a SOAP run took K-FAC's profile";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds K-FAC's units, and this run plans SOAP's"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pf
