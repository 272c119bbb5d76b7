#pragma once
// The executor's stamps of a step's actions (runtime/executor.hpp), read by the profiler and by
// K-FAC's placement (the profile a plan is made from).
#include <cstdint>

namespace pf {

// Start and end (steady clock, ns) of each action of the device's list in one step.
// `wait` is the part spent waiting for other ranks inside a compute handler (the first OPT of a
// step finishing the gradients: all-reduces, embedding sum, norm), drawn as idle time.
// `in_wait_of`: a K-FAC unit that kfac.placement = adaptive ran inside a receive's wait: that
// receive's index in the list (the pictures mark the wait it filled); -1 otherwise.
// `taps`: the part of a pass spent in K-FAC's taps on its layers (the copies of inputs and output
// gradients that later curvature units read; with an inline refresh, the curvature itself).
struct ActionTime {
  int64_t start = 0, end = 0, wait = 0;
  int64_t in_wait_of = -1;
  int64_t taps = 0;
};

}  // namespace pf
