#include "dkfac/factor_sum.hpp"

#include "comm/collectives.hpp"

#include <span>

namespace pf {

float factor_rows(const KfacPreconditioner& pre, size_t layer, Side s) {
  return static_cast<float>(pre.pending_rows(layer, s));
}

bool commit_summed(KfacPreconditioner& pre, size_t layer, Side s, double loss_scale, float summed_rows) {
  return pre.finish_curvature(layer, s, loss_scale, static_cast<int64_t>(summed_rows));
}

std::vector<float> sum_factors_over_copies(KfacPreconditioner& pre, MPI_Comm copies, bool factors) {
  std::vector<float> rows;
  std::vector<std::span<float>> bufs;
  for (size_t l = 0; l < pre.size(); ++l)
    for (Side s : {Side::A, Side::B}) {
      rows.push_back(factor_rows(pre, l, s));
      if (factors) bufs.push_back(pre.layer(l).factor(s).accumulator().span());
    }
  bufs.push_back(std::span<float>(rows));
  comm::BucketedAllReduce sum(copies, std::move(bufs));
  sum.start();
  sum.wait();
  return rows;
}

}  // namespace pf
