#pragma once
// Data + inversion parallelism among the holders of a chunk (bubbles with W > 1 replicas or
// Chimera's group; ChunkKfac::set_replicated): the holders' communicator, and this holder's
// inverse pieces of the cycle set aside until the SYNC_CURV installs them, so every holder
// switches at the same point: the pieces it inverted (NCT, and the CT pieces it owns) and those
// a BCAST_INV brought from their owner.
#include "io/checkpoint.hpp"
#include "kfac/preconditioner.hpp"

#include <mpi.h>

#include <array>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pf {

class ReplicaSync {
 public:
  // MPI_COMM_NULL: off, the pieces set aside dropped.
  void set(MPI_Comm comm, const KfacPreconditioner& pre);
  bool on() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm comm() const { return comm_; }
  // An INV of (layer, s, block; -1 whole): keep_in_use before it, set_aside after it takes the
  // fresh piece aside and puts the inverse in use back.
  void keep_in_use(const KfacFactor& f) { in_use_ = f.inverse(); }
  void set_aside(KfacFactor& f, int layer, Side s, int block);
  // BCAST_INV: the piece inverted last cycle by holder `owner` (world rank), to every holder.
  void broadcast(const KfacFactor& f, int layer, Side s, int block, int owner);
  // SYNC_CURV: the factor's pieces of the cycle into its inverse in use (false: it has none);
  // end_cycle after every factor.
  bool install(KfacFactor& f, int layer, Side s);
  void end_cycle() { flags_.zero(); }

  // Checkpoints: tensors `prefix` + "pending_A.L" / "pending_B.L" and "flags".
  using ReadTensor = std::function<void(const std::string&, const Shape&, std::span<float>)>;
  void save(const std::string& prefix, NamedTensors& out) const;
  void load(const ReadTensor& read, const std::string& prefix);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<std::array<Tensor, 2>> pending_;  // [layer][side] this cycle's pieces
  Tensor flags_;                                // [2 * layer + side] pieces set aside this cycle
  Tensor in_use_;
};

}  // namespace pf
