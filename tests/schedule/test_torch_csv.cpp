// torch.distributed.pipelining's schedule CSV (schedule/torch_csv.hpp): every generator's schedule
// round-trips; files written by hand in torch's form for a looped (2 ranks, 4 stages) and a V
// placement read as the schedules they describe; what cannot be mapped is refused naming the cell.
#include "core/error.hpp"
#include "schedule/generators.hpp"
#include "schedule/torch_csv.hpp"
#include "schedule/validate.hpp"

#include <gtest/gtest.h>

namespace pf {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_torch_csv(text, "t.csv");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(TorchCsv, EveryGeneratorRoundTrips) {
  for (const std::string& name : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zb-v"})
    for (int D : {2, 4}) {
      SCOPED_TRACE(fmt::format("{} D={}", name, D));
      const Schedule s = make_schedule(name, D, 2 * D, 2);
      const Schedule back = parse_torch_csv(to_torch_csv(s), "mine.csv");
      EXPECT_EQ(back.devices, s.devices);
      EXPECT_EQ(back.stages, s.stages);
      EXPECT_EQ(back.micro_batches, s.micro_batches);
      EXPECT_EQ(back.stage_device, s.stage_device);
      EXPECT_EQ(back.per_device, s.per_device);
      EXPECT_NO_THROW(validate(back));
    }
}

TEST(TorchCsv, RowsAlignOnUnitSteps) {
  // 1F1B on 2 ranks, 2 micro-batches: rank 1 idles one step first, rank 0 waits for 1B0 and 1B1.
  EXPECT_EQ(to_torch_csv(make_1f1b(2, 2)), "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");
}

TEST(TorchCsv, ChimeraHasNoTorchForm) {
  try {
    to_torch_csv(make_chimera(2, 2));
    FAIL() << "refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--csv-format: 'chimera' runs 2 pipelines"), std::string::npos) << e.what();
  }
}

// Looped: rank r holds stages r and r + 2 (torch's interleaved placement), GPipe-like order.
TEST(TorchCsv, HandWrittenLoopedFile) {
  const std::string looped = "0F0,0F1,,,2F0,2F1,,,,,2B0,2B1,,,0B0,0B1\n"
                             ",1F0,1F1,,,3F0,3F1,3B0,3B1,,,1B0,1B1\n";
  const Schedule s = parse_torch_csv(looped, "looped.csv");
  EXPECT_EQ(s.devices, 2);
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.micro_batches, 2);
  EXPECT_EQ(s.stage_device, (std::vector<std::vector<int>>{{0, 1, 0, 1}}));
  EXPECT_NO_THROW(validate(s));
}

// V: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (zb-v's placement), split backward; the
// compute_comms form's messages and shard actions are skipped.
TEST(TorchCsv, HandWrittenVFileWithCommunication) {
  const std::string v = "0UNSHARD,0F0,0SEND_F0,3RECV_F0,3F0,3I0,3SEND_B0,0RECV_B0,0I0,3W0,0W0,0RESHARD,0REDUCE_GRAD\n"
                        "1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2I0,1I0,1SEND_B0,2W0,1W0\n";
  const Schedule s = parse_torch_csv(v, "v.csv");
  EXPECT_EQ(s.stage_device, (std::vector<std::vector<int>>{{0, 1, 1, 0}}));
  EXPECT_EQ(s.per_device[0].size(), 6u);
  EXPECT_EQ(s.per_device[1].size(), 6u);
  EXPECT_NO_THROW(validate(s));
}

TEST(TorchCsv, RefusalsNameTheCell) {
  EXPECT_EQ(refusal("0F0,0X0\n"), "t.csv:1:2: '0X0' is not a torch.distributed.pipelining action (stage, F/I/B/W or "
                                  "a communication, micro-batch: 0F0, 2I3)");
  EXPECT_EQ(refusal("0F0,0B0\n1F0\n"), "");
  EXPECT_EQ(refusal("0F0\n0B0\n"), "t.csv:2:1: '0B0': stage 0 is on rank 0 already (row 1); a stage lives on one rank");
  EXPECT_EQ(refusal("0F,0B0\n"), "t.csv:1:1: '0F' has no micro-batch (0F0, not 0F)");
  EXPECT_EQ(refusal("0F0,0B0\n,,2F0,2B0\n"), "t.csv: no row has an action of stage 1 (the stages are 0 to 2)");
  EXPECT_EQ(refusal("\n"), "t.csv: no action: one row per rank of cells such as 0F0, 0B0");
}

}  // namespace
}  // namespace pf
