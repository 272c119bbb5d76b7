#include "comm/p2p.hpp"

#include "core/error.hpp"

#include <fmt/format.h>

#include <climits>

namespace pf::comm {

TagScheme::TagScheme(int chunks, int micro_batches) : chunks_(chunks), micro_batches_(micro_batches) {
  PF_CHECK(chunks >= 1 && micro_batches >= 1, "chunks {} micro_batches {}", chunks, micro_batches);
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &flag);
  const int64_t ub = flag ? *static_cast<int*>(attr) : 32767;
  const int64_t needed = int64_t{kMsgKinds} * chunks * micro_batches - 1;
  if (needed > ub)
    usage_error("parallel.micro_batches",
                "{} micro-batches x {} chunks need message tags up to {}, above this MPI's MPI_TAG_UB {}",
                micro_batches, chunks, needed, ub);
}

int TagScheme::tag(MsgKind kind, int chunk, int micro_batch) const {
  PF_CHECK(chunk >= 0 && chunk < chunks_ && micro_batch >= 0 && micro_batch < micro_batches_,
           "chunk {} of {}, micro-batch {} of {}", chunk, chunks_, micro_batch, micro_batches_);
  return (static_cast<int>(kind) * chunks_ + chunk) * micro_batches_ + micro_batch;
}

P2P::P2P(MPI_Comm comm, int slots) : comm_(comm), slots_(slots) {
  PF_CHECK(slots >= 1, "slots {}", slots);
  free_.reserve(slots);
  for (int i = slots - 1; i >= 0; --i) free_.push_back(i);
}

P2P::~P2P() {
  // Leaving messages in flight would let MPI write into freed buffers; a rank unwinding from
  // an error skips this (the job is going down anyway).
  if (std::uncaught_exceptions() == 0) wait_all();
}

Ticket P2P::post(bool recv, int peer, int tag, int count) {
  PF_CHECK(!free_.empty(), "all {} request slots in flight (raise P2P slots)", slots_.size());
  int i = free_.back();
  free_.pop_back();
  Slot& s = slots_[i];
  s.busy = true;
  s.recv = recv;
  s.peer = peer;
  s.tag = tag;
  s.count = count;
  return Ticket{i, ++s.gen};
}

Ticket P2P::isend(std::span<const float> buf, int dst, int tag) {
  PF_CHECK(buf.size() <= static_cast<size_t>(INT_MAX), "message of {} floats", buf.size());
  Ticket t = post(false, dst, tag, static_cast<int>(buf.size()));
  check(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, dst, tag, comm_,
                  &slots_[t.slot].req),
        "MPI_Isend");
  return t;
}

Ticket P2P::irecv(std::span<float> buf, int src, int tag) {
  PF_CHECK(buf.size() <= static_cast<size_t>(INT_MAX), "message of {} floats", buf.size());
  Ticket t = post(true, src, tag, static_cast<int>(buf.size()));
  check(MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, src, tag, comm_,
                  &slots_[t.slot].req),
        "MPI_Irecv");
  return t;
}

P2P::Slot& P2P::slot_of(Ticket t) {
  PF_CHECK(t.slot >= 0 && t.slot < static_cast<int>(slots_.size()), "bad ticket slot {}", t.slot);
  Slot& s = slots_[t.slot];
  PF_CHECK(s.busy && s.gen == t.gen, "ticket (slot {}, gen {}) already waited for", t.slot, t.gen);
  return s;
}

void P2P::finish(Slot& s, const MPI_Status& st, int index) {
  if (s.recv) {
    int got = 0;
    MPI_Get_count(&st, MPI_FLOAT, &got);
    // Same tag, wrong size: the two sides disagree about the schedule or the model split.
    if (got != s.count)
      abort_job(fmt::format("rank {}: message from pipeline rank {} (tag {}) has {} floats, expected {}",
                            world_rank(), s.peer, s.tag, got, s.count));
  }
  s.busy = false;
  free_.push_back(index);
}

bool P2P::test(Ticket t) {
  Slot& s = slot_of(t);
  int done = 0;
  MPI_Status st;
  check(MPI_Test(&s.req, &done, &st), s.recv ? "MPI_Test(recv)" : "MPI_Test(send)");
  if (done) finish(s, st, t.slot);
  return done != 0;
}

void P2P::wait(Ticket t) {
  Slot& s = slot_of(t);
  MPI_Status st;
  comm::wait(s.req, WaitSite{s.recv ? "a pipeline receive" : "a pipeline send", comm_, s.peer}, &st);
  finish(s, st, t.slot);
}

void P2P::wait_all() {
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (slots_[i].busy) wait(Ticket{i, slots_[i].gen});
}

}  // namespace pf::comm
