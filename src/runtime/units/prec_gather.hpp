#pragma once
// The precondition of a stage with several holders, split by layer (kfac.placement = bubbles,
// after planning: the plan's PrecSplit). Each holder preconditions its layers and all-gathers
// their preconditioned gradients (and v.g) among the holders, non-blocking: start() at its PREC,
// finish() before the step's gradient norm, once every PREC of the device has started (blocking
// gathers on the per-stage communicators in Chimera's twins' different orders could deadlock).
// Every holder then holds the gradients one process would have computed, bit for bit.
//
// A layer's part of the message: its weight gradient, its bias gradient, then v.g as a double's
// two floats' bits. Holder r sends its layers in layer order; the receive buffer holds holder 0's
// part, then holder 1's, ...
#include "kfac/preconditioner.hpp"

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace pf {

class PrecGather {
 public:
  // owner[l]: the rank in `comm` (the stage's holders) that preconditions layer l, -1 every
  // holder. An empty owner list: no split (every layer here, nothing gathered).
  void set(std::vector<int> owner, MPI_Comm comm, KfacPreconditioner& pre);
  bool split() const { return !owner_.empty(); }
  bool mine(int layer) const;  // this holder preconditions the layer
  // This holder's layers' preconditioned gradients and v.g to every holder (started, not waited for).
  void start(KfacPreconditioner& pre);
  // Waits for the gather start() began (if any) and installs the other holders' layers.
  void finish(KfacPreconditioner& pre);

 private:
  static int64_t floats(KfacPreconditioner& pre, int layer);  // a layer's part
  std::vector<int> owner_;     // [layer] rank in comm_, -1 every holder
  MPI_Comm comm_ = MPI_COMM_NULL;
  int me_ = 0;                 // this holder's rank in comm_
  std::vector<int> counts_, displs_;  // [rank] floats in the gather
  std::vector<float> send_, recv_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

}  // namespace pf
