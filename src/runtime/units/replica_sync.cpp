#include "runtime/units/replica_sync.hpp"

#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "core/triangle.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace pf {

namespace {

const char* side_name(int s) { return s == 0 ? "A" : "B"; }

// The rows [first, first + size) x the same columns of a dim x dim matrix (a diagonal factor:
// its entries) from `in` to `out`.
void copy_piece(const KfacFactor& f, const Tensor& in, Tensor& out, int64_t first, int64_t size) {
  const int64_t d = f.dim();
  if (f.diagonal()) {
    std::memcpy(out.data() + first, in.data() + first, static_cast<size_t>(size) * sizeof(float));
    return;
  }
  for (int64_t r = first; r < first + size; ++r)
    std::memcpy(out.data() + r * d + first, in.data() + r * d + first, static_cast<size_t>(size) * sizeof(float));
}

}  // namespace

void ReplicaSync::set(MPI_Comm comm, const KfacPreconditioner& pre) {
  comm_ = comm;
  pending_.clear();
  if (comm == MPI_COMM_NULL) return;
  for (size_t l = 0; l < pre.size(); ++l)
    pending_.push_back({Tensor(pre.layer(l).a().inverse().shape()), Tensor(pre.layer(l).b().inverse().shape())});
  flags_ = Tensor(Shape{2 * static_cast<int64_t>(pre.size())});
}

void ReplicaSync::set_aside(KfacFactor& f, int layer, Side s, int block) {
  const int64_t first = block < 0 ? 0 : f.blocks()[block].offset, size = block < 0 ? f.dim() : f.blocks()[block].size;
  copy_piece(f, f.inverse(), pending_[layer][side_index(s)], first, size);
  flags_[2 * layer + side_index(s)] += 1.0f;
  f.received_inverse() = in_use_;
}

// A CT piece: its owner sends the piece it inverted last cycle, upper triangle (a diagonal
// factor: its entries) plus a flag (0: nothing inverted yet); the others keep it with their own
// NCT pieces until the SYNC_CURV that follows installs them all.
void ReplicaSync::broadcast(const KfacFactor& f, int layer, Side s, int block, int owner) {
  PF_CHECK(on(), "BCAST_INV outside replicated bubbles");
  int me = 0, root = MPI_UNDEFINED;
  MPI_Comm_rank(comm_, &me);
  MPI_Group world, holders;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Comm_group(comm_, &holders);
  MPI_Group_translate_ranks(world, 1, &owner, holders, &root);
  MPI_Group_free(&world);
  MPI_Group_free(&holders);
  PF_CHECK(root != MPI_UNDEFINED, "BCAST_INV: rank {} holds no copy of this stage", owner);
  Tensor& piece = pending_[layer][side_index(s)];
  const int64_t d = f.dim();
  const int64_t first = block < 0 ? 0 : f.blocks()[block].offset, size = block < 0 ? d : f.blocks()[block].size;
  std::vector<float> buf(static_cast<size_t>(f.diagonal() ? size : triangle_size(size)) + 1);
  float* x = buf.data();
  if (me == root) {
    if (f.diagonal()) x = std::copy_n(piece.data() + first, size, x);
    else x = pack_triangle(piece.data(), d, first, size, x);
    *x = flags_[2 * layer + side_index(s)] > 0 ? 1.0f : 0.0f;
  }
  comm::check(MPI_Bcast(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, root, comm_), "MPI_Bcast(inverse)");
  if (me == root || buf.back() == 0.0f) return;
  x = buf.data();
  if (f.diagonal()) std::copy_n(x, size, piece.data() + first);
  else unpack_triangle(x, piece.data(), d, first, size, true);
  flags_[2 * layer + side_index(s)] += 1.0f;
}

// Block by block: a split factor's off-block entries keep what they held, as a local inversion
// of its blocks leaves them.
bool ReplicaSync::install(KfacFactor& f, int layer, Side s) {
  Tensor& in = pending_[layer][side_index(s)];
  const bool any = flags_[2 * layer + side_index(s)] > 0;
  if (any) {
    if (f.diagonal()) f.received_inverse() = in;
    else
      for (const FactorBlock& b : f.blocks()) copy_piece(f, in, f.received_inverse(), b.offset, b.size);
  }
  in.zero();
  return any;
}

void ReplicaSync::save(const std::string& prefix, NamedTensors& out) const {
  if (!on()) return;
  for (size_t l = 0; l < pending_.size(); ++l)
    for (int s = 0; s < 2; ++s) out.emplace_back(prefix + fmt::format("pending_{}.{}", side_name(s), l), pending_[l][s]);
  out.emplace_back(prefix + "flags", flags_);
}

void ReplicaSync::load(const ReadTensor& read, const std::string& prefix) {
  if (!on()) return;
  for (size_t l = 0; l < pending_.size(); ++l)
    for (int s = 0; s < 2; ++s)
      read(prefix + fmt::format("pending_{}.{}", side_name(s), l), pending_[l][s].shape(), pending_[l][s].span());
  read(prefix + "flags", flags_.shape(), flags_.span());
}

}  // namespace pf
