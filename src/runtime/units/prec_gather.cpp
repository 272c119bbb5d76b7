#include "runtime/units/prec_gather.hpp"

#include "comm/wait.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cstring>
#include <span>

namespace pf {

int64_t PrecGather::floats(KfacPreconditioner& pre, int layer) {
  const Linear& lin = pre.linear(layer);
  return lin.weight().grad.numel() + (lin.bias() ? lin.bias()->grad.numel() : 0) + 2;
}

void PrecGather::set(std::vector<int> owner, MPI_Comm comm, KfacPreconditioner& pre) {
  PF_CHECK(request_ == MPI_REQUEST_NULL, "a precondition split changed with its gather in flight");
  const int layers = static_cast<int>(pre.size());
  PF_CHECK(owner.empty() || static_cast<int>(owner.size()) == layers, "{} owners for {} layers", owner.size(), layers);
  *this = {};
  if (owner.empty()) return;
  int ranks = 0;
  MPI_Comm_size(comm, &ranks);
  MPI_Comm_rank(comm, &me_);
  owner_ = std::move(owner);
  comm_ = comm;
  counts_.assign(ranks, 0);
  for (int l = 0; l < layers; ++l)
    if (owner_[l] >= 0) counts_.at(owner_[l]) += static_cast<int>(floats(pre, l));
  displs_.assign(ranks, 0);
  for (int r = 1; r < ranks; ++r) displs_[r] = displs_[r - 1] + counts_[r - 1];
  recv_.resize(static_cast<size_t>(displs_.back() + counts_.back()));
}

bool PrecGather::mine(int layer) const { return owner_.empty() || owner_[layer] < 0 || owner_[layer] == me_; }

void PrecGather::start(KfacPreconditioner& pre) {
  send_.clear();
  for (int l = 0; l < static_cast<int>(pre.size()); ++l) {
    if (owner_[l] != me_) continue;
    Linear& lin = pre.linear(l);
    const std::span<const float> w = lin.weight().grad.span();
    send_.insert(send_.end(), w.begin(), w.end());
    if (Param* b = lin.bias()) send_.insert(send_.end(), b->grad.data(), b->grad.data() + b->grad.numel());
    float vg[2];
    const double v = pre.layer(l).last_vg();
    std::memcpy(vg, &v, sizeof v);
    send_.insert(send_.end(), vg, vg + 2);
  }
  PF_CHECK(static_cast<int>(send_.size()) == counts_[me_], "precondition gather: {} floats, {} planned", send_.size(),
           counts_[me_]);
  comm::check(MPI_Iallgatherv(send_.data(), counts_[me_], MPI_FLOAT, recv_.data(), counts_.data(), displs_.data(),
                              MPI_FLOAT, comm_, &request_),
              "MPI_Iallgatherv(preconditioned gradients)");
}

void PrecGather::finish(KfacPreconditioner& pre) {
  if (request_ == MPI_REQUEST_NULL) return;
  comm::check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait(preconditioned gradients)");
  std::vector<int64_t> at(displs_.begin(), displs_.end());  // [rank] next float
  for (int l = 0; l < static_cast<int>(pre.size()); ++l) {
    const int o = owner_[l];
    if (o < 0) continue;
    const float* x = recv_.data() + at[o];
    at[o] += floats(pre, l);
    if (o == me_) continue;
    Linear& lin = pre.linear(l);
    Tensor& w = lin.weight().grad;
    std::copy_n(x, w.numel(), w.data());
    x += w.numel();
    if (Param* b = lin.bias()) {
      std::copy_n(x, b->grad.numel(), b->grad.data());
      x += b->grad.numel();
    }
    double v = 0;
    std::memcpy(&v, x, sizeof v);
    pre.layer(l).set_last_vg(v);
  }
}

}  // namespace pf
