#include "dkfac/fusion.hpp"

#include <algorithm>
#include <limits>

namespace pf {

std::vector<FusionGroup> plan_fusion(const std::vector<double>& ready, const std::vector<int64_t>& elems,
                                     const comm::LinearCost& allreduce) {
  std::vector<FusionGroup> groups;
  if (ready.empty()) return groups;
  double prev_end = -std::numeric_limits<double>::infinity();
  FusionGroup cur{0, 0, ready[0], 0};
  int64_t cur_elems = elems[0];
  auto close = [&] {
    cur.end = cur.begin + allreduce.at(static_cast<double>(cur_elems));
    prev_end = cur.end;
    groups.push_back(cur);
  };
  for (int k = 1; k < static_cast<int>(ready.size()); ++k) {
    if (ready[k] < cur.begin + allreduce.alpha) {  // Eq. 15: merge
      cur.last = k;
      cur.begin = std::max(ready[k], prev_end);
      cur_elems += elems[k];
    } else {
      close();
      cur = {k, k, std::max(ready[k], prev_end), 0};
      cur_elems = elems[k];
    }
  }
  close();
  return groups;
}

std::vector<FusionGroup> plan_threshold(const std::vector<int64_t>& elems, int64_t max_elems) {
  std::vector<FusionGroup> groups;
  int64_t size = 0;
  for (int k = 0; k < static_cast<int>(elems.size()); ++k) {
    if (!groups.empty() && size + elems[k] <= max_elems) {
      groups.back().last = k;
      size += elems[k];
    } else {
      groups.push_back({k, k, 0, 0});
      size = elems[k];
    }
  }
  return groups;
}

}  // namespace pf
