#pragma once
// One record per chunk (stage copy) this device hosts, and the one lookup of it (HostedChunks).
// The executor makes the records at set-up and writes the pipeline's fields (executor*.cpp); the
// K-FAC units (runtime/units/) attach each chunk's K-FAC part, `kfac`, and alone write it. The
// executor never reads `kfac`: it knows K-FAC only through the KfacHandlers it is given.
#include "comm/collectives.hpp"
#include "comm/p2p.hpp"
#include "nn/model.hpp"
#include "optim/optimizer.hpp"

#include <climits>
#include <cstddef>
#include <memory>
#include <vector>

namespace pf {

class KfacService;  // runtime/units/kfac_service.hpp: the chunk's stage group's K-FAC

struct HostedChunk {
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
  HostedChunk* prev = nullptr;         // neighbour stage on this device (interleaved with D = 1 etc.)
  HostedChunk* next = nullptr;
  int prev_device = -1, next_device = -1;  // neighbour stage on another device
  std::vector<comm::Ticket> recv_f, recv_b;  // [slot]
  size_t last_backward = SIZE_MAX;     // action index of the backward that completes the gradients
  int last_backward_mb = -1;           // its micro-batch (K-FAC steps insert actions: indices move)
  int last_forward_mb = -1;            // the micro-batch of the chunk's last F
  int last_weight_mb = -1;             // split backward: the micro-batch of the W that completes them
  std::vector<std::vector<size_t>> ready_after_block;  // [block] -> grad_sync buffers final after it
  std::unique_ptr<comm::BucketedAllReduce> grad_sync;
  bool synced = false;                 // grad_sync waited for in this step
  // K-FAC's part (none without K-FAC): the stage group's K-FAC service on this rank, made and
  // destroyed by the K-FAC units, whose types the executor does not include. Last, so it is destroyed first: its taps sit on the model's layers
  // and its factor sums may report progress to grad_sync.
  std::unique_ptr<KfacService, void (*)(KfacService*)> kfac{nullptr, nullptr};
  ModelState& state(int k) { return states.size() == 1 ? states[0] : states.at(k); }
};

// The chunks this device hosts, in (pipeline, stage) order. The records stay where they are made
// (neighbours point at each other); iterating yields HostedChunk&.
class HostedChunks {
 public:
  explicit HostedChunks(int device) : device_(device) {}
  // The one lookup: the chunk of (pipeline, stage), null if this device does not host it.
  HostedChunk* find(int pipeline, int stage) const;
  HostedChunk& at(int pipeline, int stage) const;      // PF_CHECK failure if not hosted
  size_t index_of(int pipeline, int stage) const;      // its place in (pipeline, stage) order
  HostedChunk& add(int pipeline, int stage);           // a new record, kept in order
  size_t size() const { return chunks_.size(); }
  bool empty() const { return chunks_.empty(); }
  HostedChunk& operator[](size_t i) const { return *chunks_.at(i); }

  struct Iterator {
    std::vector<std::unique_ptr<HostedChunk>>::const_iterator it;
    HostedChunk& operator*() const { return **it; }
    Iterator& operator++() { return ++it, *this; }
    bool operator!=(const Iterator& o) const { return it != o.it; }
  };
  Iterator begin() const { return {chunks_.begin()}; }
  Iterator end() const { return {chunks_.end()}; }

 private:
  int device_;
  std::vector<std::unique_ptr<HostedChunk>> chunks_;
};

}  // namespace pf
