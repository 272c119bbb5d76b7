#pragma once
// Point-to-point: activations forward, activation-gradients backward.
//
// Tag scheme. A message is named by (kind, chunk, micro-batch): kind is Activation or
// ActivationGrad, chunk the model chunk that CONSUMES the message (the receiving stage's chunk:
// a stage id, or stage + D*v with virtual stages, or the up-pipeline's ids D..2D-1 under
// Chimera), micro-batch its index within the step. The tag is
//     tag = (kind * chunks + chunk) * micro_batches + micro_batch,
// unique per triple, checked against MPI_TAG_UB (2^31-1 in OpenMPI; the standard guarantees
// only 32767) when the scheme is made. Between one pair of ranks two messages only share a tag
// if they are the same triple in different steps, and MPI's non-overtaking order delivers
// those in step order, so a receive never takes another micro-batch's buffer.
//
// Buffers belong to the caller and must stay untouched until the wait returns; nothing is
// copied. Requests live in slots allocated once (capacity = the most messages in flight), so
// the steady state allocates nothing. Receives can be posted as early as the schedule allows
// and waited for later, in any order.
#include "comm/wait.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pf::comm {

enum class MsgKind : int { Activation = 0, ActivationGrad = 1 };
inline constexpr int kMsgKinds = 2;

class TagScheme {
 public:
  // chunks: model chunks in a pipeline (D, D*v, or 2D for Chimera); micro_batches per step.
  // Throws UsageError when the tags would exceed MPI_TAG_UB. Needs MPI initialised.
  TagScheme(int chunks, int micro_batches);
  int tag(MsgKind kind, int chunk, int micro_batch) const;
  int chunks() const { return chunks_; }
  int micro_batches() const { return micro_batches_; }

 private:
  int chunks_, micro_batches_;
};

// A posted send or receive: the slot and its generation (a stale ticket is caught).
struct Ticket {
  int slot = -1;
  uint32_t gen = 0;
};

class P2P {
 public:
  // comm: usually Groups::pipeline (peers are its ranks = stages). slots: most requests in flight.
  explicit P2P(MPI_Comm comm, int slots = 64);
  ~P2P();  // waits for anything still in flight
  P2P(const P2P&) = delete;
  P2P& operator=(const P2P&) = delete;

  Ticket isend(std::span<const float> buf, int dst, int tag);
  Ticket irecv(std::span<float> buf, int src, int tag);
  // True once the message is done (the ticket is then spent and its slot free).
  bool test(Ticket t);
  // Blocks (without spinning) until done. A receive checks that exactly buf.size() floats arrived.
  void wait(Ticket t);
  void wait_all();
  int in_flight() const { return static_cast<int>(slots_.size() - free_.size()); }
  MPI_Comm comm() const { return comm_; }

 private:
  struct Slot {
    MPI_Request req = MPI_REQUEST_NULL;
    uint32_t gen = 0;
    bool busy = false;
    bool recv = false;
    int peer = -1;
    int tag = 0;
    int count = 0;
  };
  Ticket post(bool recv, int peer, int tag, int count);
  Slot& slot_of(Ticket t);
  void finish(Slot& s, const MPI_Status& st, int index);

  MPI_Comm comm_;
  std::vector<Slot> slots_;
  std::vector<int> free_;  // stack of free slot indices (reserved up front)
};

}  // namespace pf::comm
