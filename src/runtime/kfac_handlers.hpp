#pragma once
// What the executor asks of K-FAC. The executor (executor.hpp) runs the pipeline and keeps the
// one dispatch table; the K-FAC kinds in it call the handlers it is given (runtime/units/
// kfac_units.hpp implements them, over the K-FAC part each chunk's record holds: hosted_chunk.hpp).
// Without K-FAC there are none, and a K-FAC kind is refused by name.
#include "schedule/schedule.hpp"

#include <cstdint>
#include <vector>

namespace pf {

// K-FAC's work in one step on this rank: factor pieces whose curvature / inversion ran (placed
// units, or an inline refresh's layers).
struct KfacWork {
  int curvature = 0, inversion = 0;
};

class KfacHandlers {
 public:
  virtual ~KfacHandlers() = default;
  // The K-FAC kinds of the dispatch table (Action names the chunk, layer, block, micro-batch).
  virtual void curvature(const Action& a) = 0;        // CURV_A, CURV_B
  virtual void curvature_sync(const Action& a) = 0;   // SYNC_CURV
  virtual void inversion(const Action& a) = 0;        // INV_A, INV_B
  virtual void inverse_broadcast(const Action& a) = 0;  // BCAST_INV_A, BCAST_INV_B
  // PREC, once the executor holds the chunk's summed gradient.
  virtual void precondition(const Action& a) = 0;
  // parallel.recompute: K-FAC takes A from the backward's re-run only, so the executor's first
  // forward of a chunk runs with its inputs skipped.
  virtual void skip_inputs(int pipeline, int stage, bool on) = 0;
  // The first OPT, before the gradient norm: every chunk preconditioned (a PREC placed after the
  // first OPT runs now), the preconditions' all-gathers completed, then the KL-clip.
  virtual void before_gradient_norm(double lr) = 0;
  // The chunk's gradient norm squared as it was before the precondition, given it after (sq).
  virtual double raw_grad_sq(int pipeline, int stage, double sq) const = 0;
  // The step is skipped (non-finite somewhere): the curvature it added is undone.
  virtual void discard_step() = 0;
  virtual KfacWork work() const = 0;  // this step's so far
  // Time spent in the layers' taps since the run began (steady-clock ns): the executor takes a
  // pass's share as the difference across it.
  virtual int64_t tap_ns() const = 0;
};

}  // namespace pf
