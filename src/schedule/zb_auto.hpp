#pragma once
// Qi et al.'s automatic zero-bubble scheduler (Zero Bubble Pipeline Parallelism, ICLR 2024,
// section 3.1, the heuristic) over any placement of one pipeline's stages (stage_device), so that
// zb-auto (stage s on device s) and zb-v (two chunks per device in a V) are one algorithm:
//   (a) warm-up: a device runs F while its warm-up cap and the memory limit allow, shrinking the
//       bubble before its first I;
//   (b) then F and I alternate (an F whenever the cap allows, else the I it waits for); a W goes
//       into every wait ahead of at least T_W, and before an F that would exceed the memory limit;
//   (c) after the last F, the remaining I and W, Ws filling the waits for I.
// The warm-up caps tried run from one micro-batch per device through 1F1B's (device d of D holds
// D - d) up to the memory limit, each with F or I first when both are ready and with a W put only
// into a wait of at least T_W or into any wait; the shortest step wins (on a tie the smaller peak
// memory, then the earlier try).
// Every action starts as soon as its device is free and its inputs have arrived (T_comm after
// their producer ends when it ran on another device): the simulator replays the order to the same
// times.
// Memory is counted in stage activations of one micro-batch on a device: an F adds one, its W
// frees it. I frees nothing, because the runtime keeps a forward's state until its W
// (runtime/executor.hpp); Qi et al.'s I frees all but what W reads. Admitting a micro-batch to a
// device keeps room for an F of each later stage it hosts there (tried two ways: for every admitted
// micro-batch, or one for all), so a V's second chunk can always run.
#include "schedule/schedule.hpp"

#include <optional>
#include <vector>

namespace pf {

// Times of one micro-batch on one of the schedule's stages (uniform stages; zb-v's are chunks, half
// a device's layers), the point-to-point time of a message between devices, and the memory limit
// as a multiple X of 1F1B's peak on device 0, its D micro-batches (X = 1 is Qi et al.'s ZB-1p,
// X = 2 ZB-2p; zb-v keeps X = 1; at most kMaxZbMemory, config/config.hpp). Without T_comm the
// order does not change with the times' scale.
struct ZbSpec {
  double forward = 1;
  double input_grad = 1;
  double weight_grad = 1;
  double comm = 0;
  double memory = 1;
};
// The heuristic's work grows as actions x devices per try (a few hundred tries): larger is refused.
inline constexpr double kMaxZbWork = 2e6;

// The fastest order the heuristic finds for `placed` (its name, sizes and stage_device; actions
// ignored) within `limit` stage activations per device, or nothing when no cap fits the limit.
std::optional<std::vector<std::vector<Action>>> zb_heuristic(const Schedule& placed, const ZbSpec& times, int limit);

}  // namespace pf
