#pragma once
// M_err^save (PipeFisher, kfac.placement = bubbles): every K-FAC layer's inputs (A side) and
// output gradients (B side) of the micro-batches of a chunk's refresh cycle, copied by its taps on
// the cycle's first step into buffers allocated once, so that CURV units later in the cycle (in
// the bubbles of later steps) read them. Slot k of a buffer holds the chunk's k-th micro-batch of
// the step; each slot records its rows (the MLM head's layers see only the masked tokens).
#include "io/checkpoint.hpp"
#include "kfac/preconditioner.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pf {

class SavedActivations {
 public:
  // slot_of[m]: the slot of the replica's local micro-batch m, -1 if the chunk does not run it;
  // rows: the most rows of one micro-batch. allocate false: no buffers (inline placements).
  SavedActivations(const KfacPreconditioner& pre, int replica, int micro_batches, std::vector<int> slot_of,
                   int64_t rows, bool allocate);
  int slots() const { return slots_; }
  int slot(int local_micro_batch) const;  // PF_CHECK failure when the chunk does not run it
  // A tap's copy of micro-batch `micro_batch` (the step's global index) for layer `layer`.
  void save(int layer, Side s, int micro_batch, const float* x, int64_t rows, int64_t cols);
  // Slot k's saved rows of a layer's side, and how many.
  const float* data(int layer, Side s, int k) const;
  int64_t rows(int layer, Side s, int k) const { return side(s)[layer].rows[k]; }
  void zero();  // a skipped step's data: never read, not worth a checkpoint

  // Checkpoints: tensors `prefix` + "saved_a.L" / "saved_b.L", and the rows per slot as JSON.
  using ReadTensor = std::function<void(const std::string&, const Shape&, std::span<float>)>;
  nlohmann::json save_state(const std::string& prefix, NamedTensors& out) const;
  void load_state(const ReadTensor& read, const std::string& prefix, const nlohmann::json& rows);
  size_t layers() const { return a_.size(); }

 private:
  struct Buffer {
    Tensor data;                // [slots * rows, d]
    std::vector<int64_t> rows;  // [slot]
  };
  const std::vector<Buffer>& side(Side s) const { return s == Side::A ? a_ : b_; }
  int replica_, micro_batches_;
  std::vector<int> slot_of_;
  int slots_ = 0;
  int64_t rows_ = 0;
  std::vector<Buffer> a_, b_;  // [layer]
};

}  // namespace pf
