#pragma once
// kfac.placement = replay: one process follows a PipeFisher run's refresh record
// (kfac/refresh_record.hpp), so it trains what the pipeline trained (the same weights to float32
// rounding: tests/runtime/test_pipefisher_replay.cpp) at one process's speed, on any thread count.
//
// Per step t: the factors re-partitioned before t are split; the K-FAC layers whose factors of
// step t some inverse will be built from (or take pi from) tap the step's micro-batches; after the
// last backward those factors are committed and kept by step; then every change of the record at
// t re-inverts a factor (or one block of it) from the kept factor of its curvature step, pi from
// the other side's kept factor of its pi step, exactly as the pipeline's INV unit did. The
// precondition then runs every step, as in the pipeline. A kept factor is dropped once no later
// change can use it (RefreshPattern::max_lag), and checkpoints carry the kept ones.
#include "config/config.hpp"
#include "kfac/preconditioner.hpp"
#include "kfac/refresh_record.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace pf {

class KfacReplay {
 public:
  // Reads cfg.kfac.refresh_record and checks it fits cfg (UsageError naming the key).
  KfacReplay(const Config& cfg, KfacPreconditioner& kfac);

  // Before step t's forwards: splits, then taps on the layers whose factors of t are used.
  // Returns whether any layer taps (the step builds curvature).
  bool begin_step(int64_t t);
  // After step t's last backward (loss_scale: the micro-batches'): commit and keep the tapped
  // factors, apply the changes of t, drop what no later step uses. Returns the changes applied.
  int end_step(int64_t t, double loss_scale);
  // A step whose loss or gradient was not finite: taps off, its sums dropped, nothing kept.
  void abandon_step();

  // Checkpoints: the kept factors as "<layer>.kfac.<A|B>@<step>" (NamedTensors order by layer,
  // side, step). prepare_resume(t) re-partitions the factors as of step t and allocates the
  // factors a run at step t keeps, so load_state reads them by name and shape.
  NamedTensors state() const;
  void prepare_resume(int64_t t);
  void load_state(const NamedTensors& in);

  // One line for the run's start: the record and its pattern.
  std::string describe() const;

 private:
  using Key = std::tuple<size_t, int, int64_t>;  // layer index, side (0 = A), step
  void apply_splits(int64_t t);
  void apply_change(const RefreshEvent& e);
  size_t layer_index(const std::string& name) const;

  KfacPreconditioner& kfac_;
  double damping_;
  RefreshRecord record_;
  RefreshPattern pattern_;
  std::map<std::string, size_t> index_;  // layer name -> K-FAC layer
  std::map<Key, Tensor> kept_;           // committed factors still to be used
};

}  // namespace pf
