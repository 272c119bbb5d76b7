#pragma once
// Where the inversions of K-FAC factors run when W ranks hold the same factors (data-parallel
// replicas of a model, or of a pipeline stage), and which of them travel as broadcasts.
//
// Load-balancing placement (SPD-KFAC, Shi et al., Algorithm 1): factors in descending dimension
// (ties: the earlier factor first); for each, with t_comp its inversion time and t_comm the
// broadcast of its inverse (upper triangle), both from measured models:
//   t_comp < t_comm  -> non-communicated (NCT): every rank inverts it itself; every load += t_comp
//   otherwise        -> communicated (CT): the rank with the least load (lowest index on a tie)
//                       inverts and broadcasts it; its load += t_comp + t_comm (Eq. 21)
// The paper's listing adds d_i to the loads (and the SPD authors' code n, with a fixed size
// threshold for NCTs); we add the modelled times, which is what Eq. 21 minimises.
//
// Round-robin placement (MPD-KFAC, Eq. 22), by layer: both factors of layer l (A_{l-1} and G_l)
// go to rank l % W, all communicated (without layers: factor i to rank i % W).
//
// Pure functions of their inputs: every rank computes the same placement from the same models.
#include <cstdint>
#include <functional>
#include <vector>

namespace pf {

inline constexpr int kEveryRank = -1;  // owner of a non-communicated factor

struct InversionPlacement {
  std::vector<int> owner;     // [factor] rank that inverts and broadcasts it, or kEveryRank
  std::vector<int> order;     // factor indices in the order they were placed (descending dimension)
  std::vector<double> load;   // [rank] modelled seconds of inversion + broadcast
  // Factors rank r inverts (its own CTs and every NCT), in placement order.
  std::vector<int> inverted_by(int rank) const;
  int communicated() const;   // number of CTs
  double makespan() const;    // max load
};

using CostOfDim = std::function<double(int64_t d)>;

// Algorithm 1. dims: factor dimensions; ranks >= 1; inv_time / bcast_time: modelled seconds for a
// d x d factor (a diagonal factor may pass a smaller "dimension" for its cost).
InversionPlacement place_load_balanced(const std::vector<int64_t>& dims, int ranks, const CostOfDim& inv_time,
                                       const CostOfDim& bcast_time);
// The same with each factor's own modelled times ([factor] seconds, or any one unit), e.g. the
// PipeFisher planner's measured per-factor inversion times; the order is still by dimension.
InversionPlacement place_load_balanced(const std::vector<int64_t>& dims, int ranks, const std::vector<double>& inv_time,
                                       const std::vector<double>& bcast_time);
// Eq. 22 (MPD-KFAC). layer_of: [factor] its layer (empty: each factor its own). Loads are filled
// from the same models when given (else 0).
InversionPlacement place_round_robin(const std::vector<int64_t>& dims, int ranks, const CostOfDim& inv_time = {},
                                     const CostOfDim& bcast_time = {}, const std::vector<int>& layer_of = {});

}  // namespace pf
