#include "kfac/placement.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <numeric>

namespace pf {

std::vector<int> InversionPlacement::inverted_by(int rank) const {
  std::vector<int> v;
  for (int f : order)
    if (owner[f] == kEveryRank || owner[f] == rank) v.push_back(f);
  return v;
}

int InversionPlacement::communicated() const {
  return static_cast<int>(std::count_if(owner.begin(), owner.end(), [](int o) { return o != kEveryRank; }));
}

double InversionPlacement::makespan() const { return load.empty() ? 0 : *std::max_element(load.begin(), load.end()); }

InversionPlacement place_load_balanced(const std::vector<int64_t>& dims, int ranks, const CostOfDim& inv_time,
                                       const CostOfDim& bcast_time) {
  std::vector<double> comp, comm;
  for (int64_t d : dims) comp.push_back(inv_time(d)), comm.push_back(bcast_time(d));
  return place_load_balanced(dims, ranks, comp, comm);
}

InversionPlacement place_load_balanced(const std::vector<int64_t>& dims, int ranks, const std::vector<double>& inv_time,
                                       const std::vector<double>& bcast_time) {
  PF_CHECK(ranks >= 1, "placement over {} ranks", ranks);
  PF_CHECK(inv_time.size() == dims.size() && bcast_time.size() == dims.size(), "placement: {} dims, {} and {} costs",
           dims.size(), inv_time.size(), bcast_time.size());
  InversionPlacement p;
  p.owner.assign(dims.size(), kEveryRank);
  p.load.assign(static_cast<size_t>(ranks), 0.0);
  p.order.resize(dims.size());
  std::iota(p.order.begin(), p.order.end(), 0);
  std::stable_sort(p.order.begin(), p.order.end(), [&](int a, int b) { return dims[a] > dims[b]; });
  for (int f : p.order) {
    const double comp = inv_time[f], comm = bcast_time[f];
    if (ranks == 1 || comp < comm) {  // non-communicated: everyone inverts it
      for (double& l : p.load) l += comp;
      continue;
    }
    const int r = static_cast<int>(std::min_element(p.load.begin(), p.load.end()) - p.load.begin());
    p.owner[f] = r;
    p.load[r] += comp + comm;
  }
  return p;
}

InversionPlacement place_round_robin(const std::vector<int64_t>& dims, int ranks, const CostOfDim& inv_time,
                                     const CostOfDim& bcast_time, const std::vector<int>& layer_of) {
  PF_CHECK(ranks >= 1, "placement over {} ranks", ranks);
  PF_CHECK(layer_of.empty() || layer_of.size() == dims.size(), "{} layers for {} factors", layer_of.size(), dims.size());
  InversionPlacement p;
  p.owner.resize(dims.size());
  p.order.resize(dims.size());
  p.load.assign(static_cast<size_t>(ranks), 0.0);
  for (size_t f = 0; f < dims.size(); ++f) {
    const size_t unit = layer_of.empty() ? f : static_cast<size_t>(layer_of[f]);
    const int r = static_cast<int>(unit % static_cast<size_t>(ranks));
    p.order[f] = static_cast<int>(f);
    p.owner[f] = ranks == 1 ? kEveryRank : r;
    if (inv_time) p.load[r] += inv_time(dims[f]) + (ranks > 1 && bcast_time ? bcast_time(dims[f]) : 0.0);
  }
  return p;
}

}  // namespace pf
