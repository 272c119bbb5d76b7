// zb-auto and zb-v in a run's layout (no MPI): ordered for parallel.backward_forward_ratio and
// parallel.zb_memory as the generator orders them, the keys refused where they do nothing.
#include "config/config.hpp"
#include "core/error.hpp"
#include "runtime/layout.hpp"
#include "schedule/generators.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

// The compute actions of a lowered schedule, per device.
std::vector<std::vector<pf::Action>> compute_order(const pf::Schedule& s) {
  std::vector<std::vector<pf::Action>> order(s.per_device.size());
  for (size_t d = 0; d < s.per_device.size(); ++d)
    for (const pf::Action& a : s.per_device[d])
      if (a.kind == pf::Kind::F || a.kind == pf::Kind::I || a.kind == pf::Kind::W) order[d].push_back(a);
  return order;
}

pf::Layout layout(const std::vector<std::string>& sets, int ranks) {
  return pf::make_layout(pf::Config::from_toml_string("", sets), ranks);
}

std::string error_of(const std::vector<std::string>& sets, int ranks) {
  try {
    layout(sets, ranks);
  } catch (const pf::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(RuntimeLayout, ZeroBubbleAutoIsOrderedForTheRatioAndTheMemory) {
  const pf::Layout a = layout({"parallel.stages=4", "parallel.micro_batches=8", "parallel.schedule=\"zb-auto\"",
                               "parallel.backward_forward_ratio=3", "parallel.zb_memory=2"}, 4);
  EXPECT_EQ(compute_order(a.schedule),
            pf::make_zb_auto(4, 8, {.forward = 1, .input_grad = 1.5, .weight_grad = 1.5, .memory = 2}).per_device);
  const pf::Layout v = layout({"parallel.stages=2", "parallel.schedule=\"zb-v\""}, 2);
  EXPECT_EQ(v.schedule.stages, 4);
  EXPECT_EQ(v.stage_blocks.size(), 4u);
  EXPECT_EQ(compute_order(v.schedule), pf::make_zb_v(2, 4, {.forward = 1, .input_grad = 1, .weight_grad = 1}).per_device);
}

TEST(RuntimeLayout, ZeroBubbleMemoryKeyRefusedWhereItDoesNothing) {
  EXPECT_EQ(error_of({"parallel.stages=2", "parallel.schedule=\"zb-h1\"", "parallel.zb_memory=2"}, 2),
            "parallel.zb_memory: only applies to parallel.schedule = \"zb-auto\" (got 2 with \"zb-h1\")");
  EXPECT_EQ(error_of({"parallel.stages=2", "parallel.schedule=\"zb-v\"", "parallel.zb_memory=2"}, 2).rfind(
                "parallel.zb_memory: only applies", 0), 0u);
  // A quarter of 1F1B's two micro-batches holds none.
  EXPECT_EQ(error_of({"parallel.stages=2", "parallel.schedule=\"zb-auto\"", "parallel.zb_memory=0.25"}, 2).rfind(
                "parallel.zb_memory: 0.25 times 1F1B's peak", 0), 0u);
  const pf::Config c = pf::Config::from_toml_string("", {"parallel.zb_memory=1.5"});
  EXPECT_EQ(pf::Config::from_toml_string(c.to_toml()).parallel.zb_memory, 1.5);
  for (const char* bad : {"nan", "inf", "0.0", "-1.0", "1e9"})
    try {
      pf::Config::from_toml_string("", {std::string("parallel.zb_memory=") + bad});
      ADD_FAILURE() << bad;
    } catch (const pf::UsageError& e) {
      // inf and nan: "must be a finite number"; the others the bounds.
      EXPECT_EQ(std::string(e.what()).rfind("parallel.zb_memory: must be ", 0), 0u) << e.what();
    }
}

}  // namespace
