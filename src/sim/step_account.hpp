#pragma once
// The account of a measured PipeFisher step against an NVLAMB step (issue 52), from the runs'
// own --profile-dir traces (sim/traced_run.hpp): where every millisecond PipeFisher adds goes.
//
// Critical path. From the action that ends the step, walk back in time: an action that started
// as soon as the one before it on its rank ended is bound by that one; a receive that waited is
// bound by its message (the sender's SEND end), the first optimizer step of a rank that waited
// by the last rank to arrive there (all ranks finish the gradients together: the norm), and a
// K-FAC unit only for its overrun (below): before its bubble's end the path goes through what
// ended the bubble. Each stretch is filed under one Part; the stretches tile [0, step time], so
// the parts sum to the step exactly. A stretch where a rank ran nothing is Part::other (the
// executor between actions: the residual). A pass's K-FAC taps (TracedAction::taps: the copies
// its layers make for later curvature units) are a part of their own: a stretch of a pass files
// the taps' share of its length under Part::taps, the rest under its pass.
//
// The difference PipeFisher's step minus NVLAMB's is the sum over the parts of (PipeFisher's
// part - NVLAMB's part): an identity, whatever the timings.
//
// A K-FAC unit's bubble (bubble_end): the work that follows it on its rank (the first action
// after it that is no curvature, inversion, sync or broadcast unit) was ready at
//   a receive:                max(end of the last such work before the unit, its message's SEND end)
//   the rank's first OPT:     max(that end, the latest arrival of the other ranks at their first OPT)
//   anything else:            that end (the unit delays it by all of its time: inline work)
// Its overrun is max(0, its end - that time); the work it delayed is the first action after it
// that is no unit and no receive (a pass, a send, the precondition, the optimizer).
#include "sim/traced_run.hpp"

#include <array>
#include <string_view>
#include <vector>

namespace pf {

enum class Part { forward, backward, taps, optimizer, communication, precondition, curvature, inversion, kfac_collective, other };
inline constexpr int kNumParts = 10;
// "forward passes", "backward passes", "K-FAC taps in passes", "optimizer", "send/receive",
// "precondition", "curvature overrun", "inversion overrun", "sync/broadcast overrun",
// "other (between actions)".
std::string_view part_name(Part p);
// F -> forward; B, I, W -> backward; OPT -> optimizer; SEND/RECV/ALLREDUCE -> communication;
// PREC -> precondition; CURV -> curvature; INV -> inversion; SYNC_CURV, BCAST_INV -> kfac_collective.
Part part_of(Kind k);
// A curvature, inversion, sync or broadcast unit: what PipeFisher places in the bubbles.
bool is_bubble_unit(Kind k);

// A stretch of the critical path: part of action `index` of `rank`'s list, or a gap (index -1).
struct PathSegment {
  int rank = 0, index = -1;
  double start = 0, end = 0;
  Part part = Part::other;
};

// When the work after a unit became ready without it, and which action set that time (index -1:
// the step's start).
struct BubbleEnd {
  double time = 0;
  int rank = 0, index = -1;
};

struct UnitAccount {
  int rank = 0, index = 0;      // in the rank's list
  double planned = std::numeric_limits<double>::quiet_NaN();  // planned duration, ms (NaN: no plan)
  double measured = 0;          // ms
  double end = 0;               // ms from the step's start
  BubbleEnd bubble;
  double overrun = 0;           // max(0, end - bubble.time)
  int delayed = -1;             // the action it delayed (overrun > 0), in the rank's list; -1 none
};

// Where a pass of PipeFisher's step ran, for telling apart what may slow it: right after a K-FAC
// unit on its own rank (the unit's data in the core's caches: it follows the unit, skipping sends
// and receives), else beside a unit of another rank for at least half of its time (sharing the
// memory system), else neither.
enum class PassSetting { after_unit, beside_unit, alone };
inline constexpr int kNumPassSettings = 3;
std::string_view pass_setting_name(PassSetting s);  // "after a unit", "beside a unit", "alone"

// Passes of one setting: how many, their time, and the same passes' (same action) time in NVLAMB's
// step, each without its K-FAC taps.
struct PassGroup {
  int count = 0;
  double ms = 0, base_ms = 0;
};

// Per rank: the passes' total time (F; B, I, W) in both steps without their K-FAC taps, the
// taps' time, and every pass by its setting.
struct RankPasses {
  int rank = 0;
  double forward = 0, backward = 0, base_forward = 0, base_backward = 0;
  double taps = 0, base_taps = 0;
  std::array<PassGroup, kNumPassSettings> by_setting{};
};

struct StepAccount {
  int step = 0, base_step = 0;
  double step_time = 0, base_step_time = 0;
  std::array<double, kNumParts> parts{}, base_parts{};  // ms of each part on the critical paths
  std::vector<PathSegment> path, base_path;
  std::vector<UnitAccount> units;  // every unit of every rank, in rank then list order
  std::vector<RankPasses> passes;
  double difference() const { return step_time - base_step_time; }
  double part_difference(Part p) const { return parts[static_cast<int>(p)] - base_parts[static_cast<int>(p)]; }
};

std::vector<PathSegment> critical_path(const TracedStep& s, int devices);
BubbleEnd bubble_end(const TracedStep& s, int devices, int rank, int index);
PassSetting pass_setting(const TracedStep& s, int rank, int index);
StepAccount account_step(const TracedStep& s, int devices, const TracedStep& base, int base_devices);
// The steps profiled in both runs, paired by number; UsageError naming `flag` when there is
// none, or when the runs have different ranks.
std::vector<StepAccount> account_run(const TracedRun& run, const TracedRun& base, const std::string& flag);

}  // namespace pf
