#pragma once
// The model is a sequence of blocks: embedding, N transformer blocks, head. A pipeline stage is a
// contiguous range of blocks. A block runs forward for one micro-batch and keeps what its backward
// needs in a BlockState; one state per micro-batch in flight, so several micro-batches can be
// between forward and backward at once, independently. States are made once at set-up.
//
// The backward comes in zero-bubble's two parts (Qi et al., ICLR 2024): I, the input gradient the
// previous stage waits for, and W, the weight gradients, which may wait. I keeps for W the output
// gradients of the layers whose weight gradients are deferred (the Linears and the embedding
// tables, the work of W); the LayerNorms' parameter gradients, a column sum each, run at I, as
// the zero-bubble implementation in Megatron defers only the Linears'.
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
struct BlockState;

// fused: W runs right after I (Block::backward), and the state's output gradients are its block's
// one shared set, a temporary like the backward's scratch. split: I and W run apart, each state
// keeps its own set from its I until its W.
enum class BackwardMode { fused, split };

// The output gradients a block's W reads, written by its I.
struct OutputGrads {
  virtual ~OutputGrads() = default;
  virtual int64_t bytes() const = 0;
  const BlockState* pending = nullptr;  // the state whose I wrote them and whose W has not run
};

struct BlockState {
  virtual ~BlockState() = default;
  // Bytes this state holds for one micro-batch (activations, statistics, masks): what a stage
  // keeps per micro-batch in flight without recomputation.
  virtual int64_t bytes() const = 0;
  BackwardMode mode = BackwardMode::fused;
  std::shared_ptr<OutputGrads> grads;  // what I keeps for W (shared by the block's states when fused)
  // Bytes held from I until W besides bytes(): the output gradients, 0 when fused.
  int64_t deferred_bytes() const { return mode == BackwardMode::split && grads ? grads->bytes() : 0; }
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
  virtual std::unique_ptr<BlockState> make_state(int max_rows, int seq, BackwardMode mode) const = 0;
  // x_in, x_out: [rows, seq, hidden]. The embedding ignores x_in; the head writes no x_out.
  // Returns the head's loss (sum of token losses x mb.loss_scale), 0 for other blocks.
  virtual float forward(const MicroBatch& mb, const Tensor& x_in, Tensor& x_out, BlockState& st) = 0;
  // I: dx_out, the gradient w.r.t. x_out (ignored by the head, which starts from its loss), to
  // dx_in (not written by the embedding); accumulates the LayerNorms' parameter gradients and
  // keeps in st.grads what W reads. dx_out may be reused once it returns.
  virtual void backward_input(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) = 0;
  // W: accumulates the other parameter gradients from what st's I kept (the same micro-batch mb).
  // After it the state may take another micro-batch's forward.
  virtual void backward_weight(const MicroBatch& mb, BlockState& st) = 0;
  // Both: the same float operations as I then W.
  void backward(const MicroBatch& mb, const Tensor& dx_out, Tensor& dx_in, BlockState& st) {
    backward_input(mb, dx_out, dx_in, st);
    backward_weight(mb, st);
  }
};

}  // namespace pf
