// pipefisher plan with zb-auto and zb-v: ordered for the given times and --zb-memory, drawn.
#include "plan_cli.hpp"

#include <nlohmann/json.hpp>

namespace pf::test {
namespace {

double step(const std::string& args) {
  PlanRun r = plan(args + " --json");
  EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out)["step_time"].get<double>() : -1.0;
}

TEST(PlanCli, ZeroBubbleAutoMeetsTheHandcraftedOrdersAtTheirMemory) {
  const std::string shape = " --stages 4 --micro-batches 8 --tf 1 --tb 1.5 --tw 0.5 --tcomm 0.1";
  EXPECT_LE(step("--schedule zb-auto" + shape), step("--schedule zb-h1" + shape));
  EXPECT_LE(step("--schedule zb-auto --zb-memory 2" + shape), step("--schedule zb-h2" + shape));
  expect_usage("--schedule zb-h1 --stages 4 --micro-batches 8 --zb-memory 2",
               "pipefisher: --zb-memory: only applies to --schedule zb-auto");
  expect_usage("--schedule zb-auto --stages 4 --micro-batches 8 --zb-memory 0",
               "pipefisher: --zb-memory: must be a multiple of 1F1B's peak memory in (0, 100], got 0");
}

TEST(PlanCli, ZeroBubbleVDrawsTwoChunksPerDevice) {
  const std::string svg = tmp("zbv.svg");
  PlanRun r = plan("--schedule zb-v --stages 4 --micro-batches 8 --svg " + svg + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["virtual_stages"].get<int>(), 2);
  EXPECT_LE(j["peak_in_flight"].get<int>(), 8);  // 1F1B's 4 micro-batches, 8 chunks
  EXPECT_NE(slurp(svg).find("zb-v D=4 N=8"), std::string::npos);
}

}  // namespace
}  // namespace pf::test
