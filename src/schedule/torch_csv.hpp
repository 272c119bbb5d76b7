#pragma once
// torch.distributed.pipelining's schedule CSV (PipelineScheduleMulti's _load_csv / _dump_csv),
// both ways, so that a torchtitan user can run our orders and we can plan theirs:
//   0F0,0F1,,1F0,...
//   ,2F0,2I0,2W0,...
// One row per rank, in rank order, no header. A cell is one action, "<stage><TYPE><micro-batch>"
// ("0F0", "2I3", "2W3", "1B5"), or empty (an idle step). The stage index is global: a rank that
// holds several stages (looped placements: interleaved; V-shaped: zb-v) names each by its own
// index, and a stage lives where its cells are. TYPE is F, B (a whole backward), I or W (the
// zero-bubble split); the compute_comms form adds SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD,
// RESHARD and REDUCE_GRAD, which reading skips: the runtime derives its messages from the compute
// order (schedule/lower.hpp), and FSDP's shard actions and the gradient reduce are not part of a
// step's order here.
#include "schedule/schedule.hpp"

#include <string>

namespace pf {

// Each rank's F, B, I and W actions, aligned on unit-time steps as to_csv aligns them. A schedule
// with two pipelines (Chimera) has no such form: UsageError naming `what`.
std::string to_torch_csv(const Schedule& s, const std::string& what = "--csv-format");

// The schedule such a file describes: devices = rows, stages and micro-batches as many as the
// highest index names, each stage on the rank whose row holds it. A cell that is no action, a
// compute action without a micro-batch, or a stage on two ranks is a UsageError naming
// "source:row:column" and the cell; so is a stage no row names.
Schedule parse_torch_csv(const std::string& text, const std::string& source);

// Whether a CSV text is torch's form rather than ours (ours begins with "# pipefisher schedule").
bool is_torch_csv(const std::string& text);

}  // namespace pf
