#pragma once
// The executor's record of one hosted chunk (stage copy), shared by its source files:
// executor.cpp (set-up, the step, the dispatch table and handlers), executor_passes.cpp (forward,
// backward, gradients), executor_model.cpp (evaluation, loading, gathering, memory). Not for use
// outside them.
#include "comm/collectives.hpp"
#include "runtime/executor.hpp"

#include <climits>
#include <memory>
#include <vector>

namespace pf {

struct Executor::Chunk {
  int pipeline = 0, stage = 0, id = 0;
  std::unique_ptr<Model> model;
  std::vector<Param*> params;
  std::unique_ptr<Optimizer> optim;
  std::vector<int> slot;               // [micro-batch] -> slot of its buffers, -1 if not run here
  int slots = 0;                       // micro-batches run here per step
  std::vector<ModelState> states;      // [slot], or one shared by all with recompute (state(k))
  Tensor recompute_out;                // the recomputed forward's output (x_out may still be in flight)
  int64_t state_bytes = 0;             // what one forward stores for its backward (ModelState)
  int64_t input_bytes = 0;             // the stage's input of one micro-batch (0 at the embedding)
  int64_t deferred_bytes = 0;          // split backward: what I keeps for W (ModelState::deferred_bytes)
  std::vector<Tensor> x_out, dx_in;    // [slot] output activation / input gradient (sent, or read locally)
  std::vector<Tensor> x_in, dx_out;    // [slot] receive buffers, when the neighbour stage is on another device
  Chunk* prev = nullptr;               // neighbour stage on this device (interleaved with D = 1 etc.)
  Chunk* next = nullptr;
  int prev_device = -1, next_device = -1;  // neighbour stage on another device
  std::vector<comm::Ticket> recv_f, recv_b;  // [slot]
  size_t last_backward = SIZE_MAX;     // action index of the backward that completes the gradients
  int last_backward_mb = -1;           // its micro-batch (K-FAC steps insert actions: indices move)
  int last_forward_mb = -1;            // the micro-batch of the chunk's last F
  int last_weight_mb = -1;             // split backward: the micro-batch of the W that completes them
  std::vector<std::vector<size_t>> ready_after_block;  // [block] -> grad_sync buffers final after it
  std::unique_ptr<comm::BucketedAllReduce> grad_sync;
  bool synced = false;                 // grad_sync waited for in this step
  ModelState& state(int k) { return states.size() == 1 ? states[0] : states.at(k); }
};

}  // namespace pf
