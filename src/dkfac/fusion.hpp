#pragma once
// Tensor fusion of K-FAC factor all-reduces (SPD-KFAC, Shi et al., Eq. 14-15; the optimal merge of
// MG-WFBP). The factors of one pass come out in a fixed sequence (A: forward order, B: backward
// order); factor k is ready at ready[k] (measured in the first steps) and its all-reduce of
// elems[k] floats costs alpha + beta * m. Walking the sequence, the current group's all-reduce
// would begin at max(ready of its last factor, end of the previous group's all-reduce); the next
// factor joins the group when it is ready before that begin + alpha (waiting for it costs less
// than the start-up a separate message would pay), and the group then begins when the joined
// factor is ready. Otherwise the group is closed and its modelled end becomes the next group's
// earliest begin.
#include "comm/perf_model.hpp"

#include <cstdint>
#include <vector>

namespace pf {

struct FusionGroup {
  int first = 0, last = 0;  // sequence positions [first, last], inclusive
  double begin = 0, end = 0;  // modelled all-reduce start and end (same time origin as ready)
};

// ready: non-decreasing is not required, but the plan assumes the sequence is the compute order.
std::vector<FusionGroup> plan_fusion(const std::vector<double>& ready, const std::vector<int64_t>& elems,
                                     const comm::LinearCost& allreduce);

// Contiguous groups of at most max_elems floats each (a group holds at least one factor): the
// fusion of a non-pipelined all-reduce after the backward (Horovod's threshold fusion).
std::vector<FusionGroup> plan_threshold(const std::vector<int64_t>& elems, int64_t max_elems);

}  // namespace pf
