#pragma once
// Lowering: from a compute-only schedule to one the runtime executes message by message.
//   F(p,s,m)    gets RECV_F(p,s,m) before it if stage s-1 is on another device,
//               and SEND_F(p,s,m) after it if stage s+1 is on another device;
//   B/I(p,s,m)  gets RECV_B(p,s,m) before it if stage s+1 is on another device,
//               and SEND_B(p,s,m) after it if stage s-1 is on another device;
//   optionally, per hosted stage at the end of the step: ALLREDUCE (gradient sync among the
//   copies of the stage; Chimera's two pipelines hold two) then OPT. Every device lists them by
//   stage so the collectives of two devices never wait on each other crosswise.
// Sends are buffered (isend), receives block (see deps.hpp).
#include "schedule/schedule.hpp"

namespace pf {

struct LowerOptions {
  bool grad_sync = false;  // add ALLREDUCE per hosted stage
  bool optimizer = false;  // add OPT per hosted stage
};

Schedule lower_communication(const Schedule& s, LowerOptions opt = {});

// The end of the step alone, appended to every device's list: per hosted stage (one with F, B, I
// or W on the device), in stage order, its ALLREDUCE then its OPT, as `opt` asks. The one
// definition the runtime's lowered step and `pipefisher plan`'s simulated step share.
void append_step_end(Schedule& s, LowerOptions opt);

}  // namespace pf
