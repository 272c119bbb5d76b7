#pragma once
// The model is a sequence of blocks: embedding, N transformer blocks, head. A pipeline stage is a
// contiguous range of blocks. A block runs forward for one micro-batch and keeps what its backward
// needs in a BlockState; one state per micro-batch in flight, so several micro-batches can be
// between forward and backward at once, independently. States are made once at set-up.
#include "core/micro_batch.hpp"
#include "core/tensor.hpp"
#include "nn/param.hpp"

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace pf {

class Linear;

struct BlockState {
  virtual ~BlockState() = default;
  // Bytes this state holds for one micro-batch (activations, statistics, masks): what a stage
  // keeps per micro-batch in flight without recomputation.
  virtual int64_t bytes() const = 0;
};

// Bytes of float tensors and of byte / index vectors, for BlockState::bytes.
inline int64_t bytes_of(std::initializer_list<const Tensor*> ts) {
  int64_t n = 0;
  for (const Tensor* t : ts) n += t->numel() * static_cast<int64_t>(sizeof(float));
  return n;
}

class Block {
 public:
  virtual ~Block() = default;
  virtual std::string name() const = 0;
  // Parameters this block holds (a tied parameter appears once, at its owner; see Param::mirror).
  virtual std::vector<Param*> params() = 0;
  // The Linear layers inside, in forward order (what K-FAC preconditions).
  virtual std::vector<Linear*> linears() { return {}; }
  // Memory for one micro-batch in flight of up to max_rows x seq tokens.
  virtual std::unique_ptr<BlockState> make_state(int max_rows, int seq) const = 0;
  // x_in, x_out: [rows, seq, hidden]. The embedding ignores x_in; the head writes no x_out.
  // Returns the head's loss (sum of token losses x mb.loss_scale), 0 for other blocks.
  virtual float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) = 0;
  // dx_out: gradient w.r.t. x_out (ignored by the head, which starts from its loss);
  // writes dx_in (not for the embedding) and accumulates parameter gradients.
  virtual void backward(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) = 0;
};

}  // namespace pf
