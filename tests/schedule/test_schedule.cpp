// Schedule IR, generators, text/CSV forms, validator, lowering.
#include "schedule/deps.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "schedule/validate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace pf {
namespace {

bool defined(const std::string& name, int D, int N) {
  if (name == "chimera") return D % 2 == 0 && N % D == 0;
  if (name == "interleaved") return N % D == 0;
  if (name == "zb-h2") return N >= D;
  return true;
}

TEST(Generators, EveryScheduleValidOrRefusedForSmallSizes) {
  for (const std::string& name : schedule_names())
    for (int D = 1; D <= 8; ++D)
      for (int N = 1; N <= 3 * D; ++N) {
        SCOPED_TRACE(fmt::format("{} D={} N={}", name, D, N));
        if (!defined(name, D, N)) {
          EXPECT_THROW(make_schedule(name, D, N), UsageError);
          continue;
        }
        Schedule s = make_schedule(name, D, N, 2);
        EXPECT_EQ(s.devices, D);
        EXPECT_EQ(s.micro_batches, N);
        EXPECT_NO_THROW(validate(s));
        // Each device does the same amount of work: 2 or 3 actions per (hosted stage, micro-batch).
        const size_t per = name.starts_with("zb-") ? 3 : 2;
        const size_t hosted = name == "interleaved" || name == "zb-v" ? 2 : 1;
        for (int d = 0; d < D; ++d) EXPECT_EQ(s.per_device[d].size(), per * hosted * N);
      }
}

TEST(Generators, InterleavedWithThreeChunksValid) {
  for (int D = 1; D <= 6; ++D)
    for (int k = 1; k <= 3; ++k) EXPECT_NO_THROW(validate(make_interleaved(D, k * D, 3)));
}

TEST(Generators, RefusalsExplainTheConstraint) {
  try {
    make_chimera(3, 6);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--stages: chimera needs an even number"), std::string::npos) << e.what();
  }
  try {
    make_interleaved(4, 6, 2);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of --stages (4)"), std::string::npos) << e.what();
  }
  try {
    make_zb_h2(4, 3);
    FAIL();
  } catch (const UsageError& e) {
    const std::string why = "--micro-batches: zb-h2 needs at least as many micro-batches as stages (4), got 3";
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_schedule("pipedream", 4, 4), UsageError);
  EXPECT_THROW(make_1f1b(0, 4), UsageError);
  EXPECT_THROW(make_gpipe(4, 0), UsageError);
}

TEST(Generators, OneFOneBPhases) {
  // Device 1 of 4, N = 6: 2 warm-up forwards, 4 pairs, 2 cool-down backwards.
  Schedule s = make_1f1b(4, 6);
  std::string row;
  for (const Action& a : s.per_device[1]) row += to_token(a) + " ";
  EXPECT_EQ(row, "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5 ");
}

TEST(Generators, InterleavedMegatronOrder) {
  // D = 2, V = 2, N = 4: stage of chunk c on rank r is c*2 + r; rank 0 warms up with
  // (2-0-1)*2 + (2-1)*2 = 4 virtual micro-batches: chunk 0 on mb 0,1 then chunk 1 on mb 0,1.
  Schedule s = make_interleaved(2, 4, 2);
  std::string row;
  for (const Action& a : s.per_device[0]) row += to_token(a) + " ";
  EXPECT_EQ(row, "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3 ");
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.device_of(0, 3), 1);
}

TEST(Generators, ChimeraPlacement) {
  Schedule s = make_chimera(4, 8);
  EXPECT_EQ(s.pipelines, 2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.device_of(0, i), i);
    EXPECT_EQ(s.device_of(1, 3 - i), i);
  }
  // Micro-batches 0,1 (and 4,5) go down, 2,3 (and 6,7) go up.
  for (const Action& a : s.per_device[0]) EXPECT_EQ(a.pipeline, (a.micro_batch % 4) / 2);
}

TEST(UnitSteps, OneFOneBTakesTwiceNPlusDMinusOneSteps) {
  for (int D = 1; D <= 6; ++D)
    for (int N = 1; N <= 2 * D; ++N) {
      Schedule s = make_1f1b(D, N);
      UnitSteps st = unit_steps(s, build_dependencies(s));
      EXPECT_TRUE(st.complete);
      EXPECT_EQ(st.num_steps, 2 * (N + D - 1));
    }
}

TEST(Text, TokenRoundTrip) {
  std::vector<Action> all = {act(Kind::F, 3, 1),          act(Kind::B, 0, 5, 1),       act(Kind::I, 12, 40),
                             act(Kind::W, 2, 0),          act(Kind::SEND_F, 1, 0),     act(Kind::RECV_B, 2, 7, 1),
                             act(Kind::ALLREDUCE, 4, -1), act(Kind::OPT, 0, -1, 1),    act(Kind::PREC, 1, -1),
                             {Kind::CURV_A, 2, 0, 1, 4},  {Kind::CURV_B, 2, 1, 3, 0},  {Kind::INV_A, 2, 0, -1, 4},
                             {Kind::INV_B, 2, 0, -1, 11}, {Kind::SYNC_CURV, 5, 0, -1, -1}};
  for (const Action& a : all) EXPECT_EQ(parse_token(to_token(a), "t"), a) << to_token(a);
  EXPECT_EQ(to_token(all[0]), "3F1");
  EXPECT_EQ(to_token(all[1]), "0B5p1");
  EXPECT_EQ(to_token(all[9]), "2CURV_A1l4");
  EXPECT_EQ(to_token(all[11]), "2INV_Al4");
}

TEST(Text, MalformedTokensNameTheLocation) {
  for (const char* bad : {"F1", "3f1", "3X1", "3F", "3PREC1", "3F1q2", "3 F1"}) {
    try {
      parse_token(bad, "file.txt:4");
      FAIL() << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("file.txt:4: ", 0), 0u) << e.what();
    }
  }
}

TEST(Text, TextAndCsvRoundTripEveryGenerator) {
  for (const std::string& name : schedule_names())
    for (bool lowered : {false, true}) {
      Schedule s = make_schedule(name, 4, 8, 2);
      if (lowered) s = lower_communication(s, {true, true});
      Schedule t = parse_text(to_text(s), "mem");
      Schedule c = parse_csv(to_csv(s), "mem.csv");
      for (const Schedule* r : {&t, &c}) {
        EXPECT_EQ(r->name, s.name);
        EXPECT_EQ(r->devices, s.devices);
        EXPECT_EQ(r->stages, s.stages);
        EXPECT_EQ(r->pipelines, s.pipelines);
        EXPECT_EQ(r->micro_batches, s.micro_batches);
        EXPECT_EQ(r->stage_device, s.stage_device);
        EXPECT_EQ(r->per_device, s.per_device);
      }
      EXPECT_EQ(to_csv(c), to_csv(s));  // and the CSV text itself is stable
    }
}

TEST(Text, CsvAlignsActionsToUnitSteps) {
  // 1F1B, D = 2, N = 2: device 1 idles at step 0.
  std::string csv = to_csv(make_1f1b(2, 2));
  EXPECT_NE(csv.find("\n0,0F0,0F1,,0B0,,0B1\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\n1,,1F0,1B0,1F1,1B1\n"), std::string::npos) << csv;
}

TEST(Text, HandWrittenScheduleWithCommentsAndMap) {
  std::string text =
      "# pipefisher schedule name=mine devices=2 stages=2 pipelines=1 micro_batches=1\n"
      "# map p0: 1 0\n"
      "# stage 0 on device 1\n"
      "1: 0F0 0B0\n"
      "0: 1F0 1B0\n";
  Schedule s = parse_text(text, "mine.txt");
  EXPECT_EQ(s.device_of(0, 0), 1);
  EXPECT_NO_THROW(validate(s));
  EXPECT_THROW(parse_text("0: 0F0\n", "x.txt"), UsageError);  // no header
  EXPECT_THROW(parse_text("# pipefisher schedule name=a devices=1 stages=1 pipelines=1 micro_batches=1\n5: 0F0\n", "x"),
               UsageError);  // device out of range
}

std::string refusal(const Schedule& s) {
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    return std::string(e.what()) + "\n" + e.grid;
  }
  return "";
}

TEST(Validator, MissingBackwardIsRefusedWithMarkedGrid) {
  Schedule s = make_1f1b(4, 4);
  auto& row = s.per_device[2];
  row.erase(std::find(row.begin(), row.end(), act(Kind::B, 2, 3)));
  std::string msg = refusal(s);
  EXPECT_NE(msg.find("schedule: stage 2 micro-batch 3 (device 2) needs one B or one I and one W (has B=0 I=0 W=0)"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("*2F3*"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dev 3"), std::string::npos) << msg;
}

TEST(Validator, DuplicateAndWrongDeviceAreRefused) {
  Schedule s = make_gpipe(3, 2);
  s.per_device[1].push_back(act(Kind::F, 1, 0));
  EXPECT_NE(refusal(s).find("duplicate F"), std::string::npos);
  s = make_gpipe(3, 2);
  s.per_device[0][0] = act(Kind::F, 1, 0);
  EXPECT_NE(refusal(s).find("stage 1 of pipeline 0 lives on device 1"), std::string::npos) << refusal(s);
}

TEST(Validator, SwappedDependencyIsRefused) {
  Schedule s = make_1f1b(3, 3);
  auto& row = s.per_device[2];  // last stage: 2F0 2B0 ...; put the backward first
  std::swap(row[0], row[1]);
  std::string msg = refusal(s);
  EXPECT_NE(msg.find("2B0 (device 2, position 0) is placed before 2F0 it depends on"), std::string::npos) << msg;
  EXPECT_NE(msg.find("*2B0*"), std::string::npos) << msg;
}

TEST(Validator, CrossDeviceDeadlockIsRefused) {
  Schedule s = make_naive(2, 2);
  // Device 1 takes micro-batch 1 first while device 0 waits for micro-batch 0's backward.
  s.per_device[1] = {act(Kind::F, 1, 1), act(Kind::B, 1, 1), act(Kind::F, 1, 0), act(Kind::B, 1, 0)};
  std::string msg = refusal(s);
  EXPECT_NE(msg.find("deadlock with blocking communication at step 1: 0B0 (device 0, position 1) cannot run, "
                     "waiting for 1B0 on device 1"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("*0B0*"), std::string::npos) << msg;
  EXPECT_NE(msg.find(">1F1<"), std::string::npos) << msg;
}

TEST(Validator, MicroBatchInTwoPipelinesIsRefused) {
  Schedule s = make_chimera(2, 2);  // micro-batch 1 goes up: stage 0 on device 1, stage 1 on device 0
  auto& row0 = s.per_device[0];
  row0.erase(std::remove_if(row0.begin(), row0.end(), [](const Action& a) { return a.micro_batch == 1; }),
             row0.end());
  // ...but its stage 1 now runs in the down pipeline (stage 1 on device 1).
  s.per_device[1].push_back(act(Kind::F, 1, 1, 0));
  s.per_device[1].push_back(act(Kind::B, 1, 1, 0));
  std::string msg = refusal(s);
  EXPECT_NE(msg.find("micro-batch 1 runs in more than one pipeline"), std::string::npos) << msg;
}

TEST(Lowering, AddsMatchingSendsAndReceives) {
  for (const std::string name : {"1f1b", "chimera", "interleaved", "zb-h1", "zb-h2"}) {
    Schedule s = make_schedule(name, 4, 8, 2);
    Schedule l = lower_communication(s, {true, true});
    EXPECT_NO_THROW(validate(l)) << name;
    std::multiset<std::tuple<int, int, int>> sends_f, recvs_f;
    int allreduce = 0;
    for (const auto& row : l.per_device)
      for (const Action& a : row) {
        if (a.kind == Kind::SEND_F) sends_f.insert({a.pipeline, a.stage + 1, a.micro_batch});
        if (a.kind == Kind::RECV_F) recvs_f.insert({a.pipeline, a.stage, a.micro_batch});
        allreduce += a.kind == Kind::ALLREDUCE;
      }
    EXPECT_EQ(sends_f, recvs_f) << name;
    // Every stage boundary crosses devices here: (stages - 1) messages per micro-batch.
    EXPECT_EQ(sends_f.size(), static_cast<size_t>((s.stages - 1) * 8)) << name;
    EXPECT_EQ(allreduce, s.stages * s.pipelines) << name;
    UnitSteps st = unit_steps(l, build_dependencies(l));
    EXPECT_TRUE(st.complete) << name;
  }
}

// The step end is one definition: lowering's tail is append_step_end's, per hosted stage in stage
// order ALLREDUCE then OPT (what `pipefisher plan` simulates for a run's profile with W > 1).
TEST(Lowering, StepEndIsAppendStepEnd) {
  for (const std::string name : {"1f1b", "chimera", "interleaved"}) {
    const Schedule s = make_schedule(name, 4, 8, 2);
    Schedule ended = s;
    append_step_end(ended, {.grad_sync = true, .optimizer = true});
    const Schedule lowered = lower_communication(s, {.grad_sync = true, .optimizer = true});
    for (int d = 0; d < s.devices; ++d) {
      const auto& e = ended.per_device[d];
      const auto& l = lowered.per_device[d];
      const size_t added = e.size() - s.per_device[d].size();
      ASSERT_GE(l.size(), added) << name;
      EXPECT_TRUE(std::equal(e.end() - static_cast<std::ptrdiff_t>(added), e.end(),
                             l.end() - static_cast<std::ptrdiff_t>(added)))
          << name << " device " << d;
      std::vector<Kind> kinds;
      std::vector<int> stages;
      for (auto it = e.end() - static_cast<std::ptrdiff_t>(added); it != e.end(); ++it)
        kinds.push_back(it->kind), stages.push_back(it->stage);
      ASSERT_EQ(added % 2, 0u) << name;
      for (size_t k = 0; k < added; k += 2) {
        EXPECT_EQ(kinds[k], Kind::ALLREDUCE) << name;
        EXPECT_EQ(kinds[k + 1], Kind::OPT) << name;
        EXPECT_EQ(stages[k], stages[k + 1]) << name;
        if (k > 0) EXPECT_LE(stages[k - 2], stages[k]) << name;
      }
    }
  }
}

}  // namespace
}  // namespace pf
