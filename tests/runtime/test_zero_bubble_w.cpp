// Zero-bubble W moved by the planner (place_weight_gradients) in a real run: K-FAC in the bubbles
// of ZB-H1 on 2 ranks, planned from made-up timings under which device 1 waits for each forward
// of a slow device 0 and its W fit those waits. The run's plan moves W, and training still
// equals single-process K-FAC with the same refresh pattern (pipefisher_fixture.hpp).
#include "pipefisher_fixture.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace {

using namespace pf_test::pipefisher;

// made_up_plan_profile's file with device 0's forwards at 4 ms, device 1's W at 1.5 ms and every
// other F, I and W at 0.5 ms (the hand-timed case of tests/plan/test_plan_w.cpp, on the run's
// lowered step): by the planner's simulation 3 of the 8 W move (step 22 -> 20.5 ms).
fs::path w_moving_profile(const std::string& name, const std::string& sets, const std::vector<std::string>& cfg_sets) {
  const fs::path file = made_up_plan_profile(name, sets, 2);
  const pf::Config cfg = load_config(cfg_sets);
  const pf::Layout layout = pf::make_layout(cfg, 2);
  pf::PlanProfile p = pf::read_profile_json(file.string()).plan;
  for (int d = 0; d < 2; ++d)
    for (size_t i = 0; i < p.action_ms[d].size(); ++i) {
      const pf::Kind k = layout.schedule.per_device[d][i].kind;
      if (k == pf::Kind::F) p.action_ms[d][i] = d == 0 ? 4 : 0.5;
      if (k == pf::Kind::I || k == pf::Kind::W) p.action_ms[d][i] = k == pf::Kind::W && d == 1 ? 1.5 : 0.5;
    }
  std::ofstream(file) << pf::plan_profile_json(cfg, layout, p).dump();
  return file;
}

// The W the run's plan moved ("pipefisher: zero-bubble W: 3 of 8 moved ..."), -1 without the line.
int moved_w(const std::string& out) {
  constexpr const char* kLine = "pipefisher: zero-bubble W: ";
  const size_t at = out.find(kLine);
  return at == std::string::npos ? -1 : std::atoi(out.c_str() + at + std::strlen(kLine));
}

TEST(PipeFisherRuntime, ZeroBubbleWMovedByThePlanEqualsSingleProcess) {
  const std::string sets = "--set parallel.stages=2 --set parallel.schedule=zb-h1";
  const fs::path profile = w_moving_profile("zbh1_w", sets, {"parallel.stages=2", "parallel.schedule=zb-h1"});
  std::string out;
  expect_bubbles_match("zbh1_w", 2, sets + " --set kfac.plan_profile=" + profile.string(), {}, "", &out);
  EXPECT_EQ(moved_w(out), 3) << out;
}

}  // namespace
