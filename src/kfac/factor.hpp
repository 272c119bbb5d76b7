#pragma once
// One Kronecker factor of a K-FAC layer (A from the layer's inputs, or B from the gradients w.r.t.
// its outputs): the factor itself, its damped inverse and the counters of its work.
//
// Three work units act on a factor, each callable on its own so PipeFisher can place them in
// different bubbles (or on different ranks):
//   curvature  accumulate(x)  -> factor += scale * x^T x for one micro-batch (ssyrk, upper triangle)
//              commit()       -> the step's sum becomes the factor (or is folded into its EMA)
//   inversion  invert_block() -> inverse of (factor block + damping * I) by Cholesky
// The precondition unit (which applies the inverses of both factors) lives in KfacLayer.
//
// Block-diagonal approximation (PipeFisher appendix A.2): with k blocks, the factor keeps only k
// contiguous diagonal blocks; curvature computes only those (1/k of the flops) and each block is an
// independent inversion unit of size d/k (1/k^2 of the flops each). The matrices are still stored
// d x d with zero off-diagonal blocks: the split saves time, not memory.
//
// A diagonal factor (kind Diagonal; used for B of layers wider than diag_limit, as ASDL does) keeps
// only diag(factor) as a vector [d].
#include "core/tensor.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pf {

enum class FactorKind { Dense, Diagonal };

// Named tensors for checkpoints: (name, tensor) in a fixed order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct FactorBlock {
  int64_t offset = 0;  // first row/column of the block
  int64_t size = 0;
};

// Splits d into k contiguous blocks of sizes differing by at most one (the first d % k get +1).
std::vector<FactorBlock> split_blocks(int64_t d, int k);
// Flop estimates of the work units. Curvature of a dense block: rows * n^2 (ssyrk's n(n+1)/2
// multiply-adds). Inversion of a block: n^3 (potrf n^3/3 + potri 2n^3/3).
double curvature_flops(int64_t d, int k, int64_t rows, FactorKind kind = FactorKind::Dense);
double inversion_flops(int64_t d, int k, FactorKind kind = FactorKind::Dense);
// The smallest block count whose largest block's inversion costs at most max_block_flops
// (what a planner uses to cut an inversion that fits no bubble). At most d.
int blocks_for_budget(int64_t d, double max_block_flops);

enum class InvertStatus {
  Ok,         // inverted with the requested damping
  Raised,     // not positive definite at first: inverted with damping raised `retries` times
  Failed,     // still not positive definite after every retry: previous inverse kept
  NonFinite,  // the factor holds NaN/Inf: no retry (more damping cannot help), previous inverse kept
};
const char* status_name(InvertStatus s);

struct InvertResult {
  InvertStatus status = InvertStatus::Ok;
  int retries = 0;       // times the damping was raised
  double damping = 0;    // damping of the inverse now in use for this block (the last tried if failed)
  bool ok() const { return status == InvertStatus::Ok || status == InvertStatus::Raised; }
};

class KfacFactor {
 public:
  // ema_decay in [0, 1): 0 = the factor is the latest step's sum only.
  // max_retries: times the damping is raised x10 when Cholesky fails.
  KfacFactor(std::string name, int64_t dim, FactorKind kind = FactorKind::Dense, int blocks = 1,
             double ema_decay = 0.0, int max_retries = 3);

  const std::string& name() const { return name_; }
  int64_t dim() const { return dim_; }
  FactorKind kind() const { return kind_; }
  bool diagonal() const { return kind_ == FactorKind::Diagonal; }
  double ema_decay() const { return ema_decay_; }
  const std::vector<FactorBlock>& blocks() const { return blocks_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }

  // Re-partitions into k blocks (set-up or re-planning time: allocates). The factor's entries
  // outside the new blocks are dropped; the current inverse stays in use until re-inverted.
  void set_blocks(int k);

  // --- curvature ---
  // factor_acc += scale * x^T x, x: [rows, dim] with row stride ld (>= dim). The first call after
  // a commit starts a new sum. Dense: upper triangle only (of each block). No allocation.
  void accumulate(const float* x, int64_t rows, int64_t ld, float scale);
  // The step's running sum (what a data-parallel curvature sync all-reduces before commit; dense:
  // only the upper triangle of each block is meaningful). Same tensor as value() when ema is 0
  // and no own accumulator was asked for.
  Tensor& accumulator() { return acc_.empty() ? value_ : acc_; }
  // With ema 0: sum in a buffer of its own (on), so the committed factor can be inverted while
  // the next sum accumulates (PipeFisher's Chimera group inverts cycle c's factors during cycle
  // c+1's curvature); costs one more factor of memory. A sum in progress moves with the switch.
  // With ema > 0 the sum always has its own buffer.
  void set_own_accumulator(bool on);
  bool own_accumulator() const { return !acc_.empty(); }
  int64_t pending_micro_batches() const { return pending_; }
  // Ends the step's accumulation: factor = sum (first time, or ema 0) or
  // factor = decay * factor + (1 - decay) * sum; mirrors the upper triangle; caches the trace.
  // Returns false (and does nothing) when nothing was accumulated since the last commit.
  bool commit();
  // The factor: symmetric [dim, dim] (dense) or [dim] (diagonal); valid after a commit.
  const Tensor& value() const { return value_; }
  double trace() const { return trace_; }  // of value(), as of the last commit
  // Replaces the factor (tests, checkpoint load, a sync that delivers a committed factor).
  void set_value(const Tensor& v);

  // --- inversion ---
  // inverse(block j) = (factor block j + damping * I)^-1 by potrf + potri on a copy of the block
  // in a preallocated workspace: the factor itself is never modified. When Cholesky fails the
  // damping is raised (x10, from a floor if 0) up to max_retries times, each logged; if it still
  // fails the previous inverse stays. NaN/Inf in the block: no retry, previous inverse stays.
  // With ema 0 the factor is accumulated in place, so inverting between the first curvature of a
  // step and its commit is refused (PF_CHECK); with ema > 0 (or an own accumulator) the sum has
  // its own buffer and the factor can be inverted at any time.
  InvertResult invert_block(int j, double damping);
  // All blocks; the result is the worst block's (status order Ok < Raised < Failed < NonFinite).
  InvertResult invert(double damping);
  // Symmetric [dim, dim] block-diagonal (dense) or [dim] (diagonal); the identity until the first
  // successful inversion (so preconditioning passes the gradient through unchanged before it).
  const Tensor& inverse() const { return inverse_; }
  // Data-parallel placement (dkfac/distributed_kfac.hpp): one rank inverts, the others write the
  // broadcast inverse here (same layout as inverse(); counters are not touched).
  Tensor& received_inverse() { return inverse_; }

  // --- counters ---
  int64_t commits() const { return commits_; }          // curvature updates (steps)
  int64_t inversions() const { return inversions_; }    // successful block inversions
  int64_t retries() const { return retries_; }          // damping raises
  int64_t failures() const { return failures_; }        // block inversions that kept the old inverse

  // Checkpoint state: "<prefix>" (factor), "<prefix>_inv" (inverse), "<prefix>_counters"
  // [commits, inversions, retries, failures] as floats (exact below 2^24).
  void save(const std::string& prefix, NamedTensors& out) const;
  // Loads what save wrote; a missing tensor or a wrong shape is a UsageError naming the tensor.
  void load(const std::string& prefix, const NamedTensors& in);
  // A run stopped mid-accumulation (the pipeline runtime's checkpoints): after load(), the
  // micro-batches pending in accumulator() and the trace of the last commit (with ema 0 the
  // factor is summed in place, so its entries no longer give that trace).
  void restore_accumulation(int64_t pending, double trace) { pending_ = pending, trace_ = trace; }

 private:
  bool try_invert(const FactorBlock& b, double damping, int* info);
  double mean_diag(const FactorBlock& b) const;

  std::string name_;
  int64_t dim_;
  FactorKind kind_;
  double ema_decay_;
  int max_retries_;
  std::vector<FactorBlock> blocks_;
  Tensor value_;    // the factor
  Tensor acc_;      // the step's sum when ema_decay > 0 or asked for (else empty: value_ accumulates directly)
  Tensor inverse_;
  Tensor work_;     // the damped copy being inverted: largest block^2 (dense) or largest block
  int64_t pending_ = 0;
  double trace_ = 0;
  int64_t commits_ = 0, inversions_ = 0, retries_ = 0, failures_ = 0;
};

// Seconds one inversion of a made-up well-conditioned d x d factor takes here: the probe the
// inversion-time model is fitted from (comm/perf_model.hpp).
double time_one_inversion(int64_t d);

}  // namespace pf
