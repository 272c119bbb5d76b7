#pragma once
// The dependency graph of a schedule, shared by the validator (unit steps, deadlock detection)
// and the timed simulator. An action waits for:
//   F(p,s,m)      F(p,s-1,m)                      (or RECV_F(p,s,m) once lowered)
//   B/I(p,s,m)    F(p,s,m) and B/I(p,s+1,m)       (or RECV_B(p,s,m) once lowered)
//   W(p,s,m)      I(p,s,m)
//   SEND_F(p,s,m) F(p,s,m);   RECV_F(p,s,m)  SEND_F(p,s-1,m)
//   SEND_B(p,s,m) B/I(p,s,m); RECV_B(p,s,m)  SEND_B(p,s+1,m)
//   ALLREDUCE(p,s) every final backward (B or W) of (p,s)
//   OPT(p,s)      every final backward of (p,s), ALLREDUCE(p,s), PREC(p,s)
//   K-FAC units   what they read (the K-FAC graph's table, schedule/kfac_graph.hpp; a CURV_A
//                 reads its F: with recomputation the plan puts it after the backward too, on the
//                 same device)
// (only the listed actions that exist in the schedule). Collective kinds (ALLREDUCE, SYNC_CURV,
// BCAST_INV_*) with the same (kind, stage, layer, block) on different devices form a group that starts together:
// the copies of one stage (Chimera's down and up pipelines, data-parallel replicas).
// Communication semantics: sends are buffered (isend), receives and data waits block.
#include "schedule/schedule.hpp"

#include <vector>

namespace pf {

struct ActionRef {
  int device = -1;
  int index = -1;
  friend bool operator==(const ActionRef&, const ActionRef&) = default;
};

struct Dependencies {
  std::vector<std::vector<std::vector<ActionRef>>> waits_for;  // [device][index] -> actions
  std::vector<std::vector<int>> group_of;                      // [device][index] -> group or -1
  std::vector<std::vector<ActionRef>> groups;                  // collective groups
};

Dependencies build_dependencies(const Schedule& s);

// Plays the schedule with every action taking one unit step: at step t a device runs its next
// action if everything it waits for finished before t (same-device predecessors: earlier in the
// order). Collective groups run at one step when all members are next in line.
struct UnitSteps {
  std::vector<std::vector<int>> step;  // [device][index] -> step, -1 if it never ran (deadlock)
  int num_steps = 0;
  bool complete = true;
};
UnitSteps unit_steps(const Schedule& s, const Dependencies& deps);

}  // namespace pf
