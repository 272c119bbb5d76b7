#pragma once
// The paper's memory model (section 3.3), per device, worst device reported:
//   M_pipe   = 2 * (stage copies per device) * M_theta + N * M_act + M_err^peak
//   M_kfac+  = M_curv + M_inv + N * M_err^save,   M_curv = M_inv
// generalised to non-uniform stages by summing over the stages a device hosts, each weighted by
// the micro-batches it processes there (Chimera: N/2 per pipeline copy). m_pipe_in_flight
// replaces N * M_act by the activations actually held at the simulated peak (1F1B holds fewer
// than N). All values in the profile's unit (MB).
// With activation recomputation (R, the paper's Figures 5, 9, 10) a stage keeps only its input per
// micro-batch (not modelled: the profiles do not give it) and rebuilds one micro-batch's
// activations before its backward: N * M_act becomes M_act per hosted stage.
// With a split backward (zero-bubble's I and W) a micro-batch's M_act is held until its W, and
// the output gradients W reads, M_W, from its I until its W (runtime/executor.hpp does the same).
#include "config/config.hpp"
#include "schedule/schedule.hpp"
#include "sim/sim.hpp"

#include <vector>

namespace pf {

// The memory model's MB: 2^20 bytes.
inline constexpr double kBytesPerMB = 1024.0 * 1024.0;

struct StageMemory {
  double param = 0;     // M_theta: parameters of the stage
  double act = 0;       // M_act: activations of one micro-batch
  double err_peak = 0;  // M_err^peak: peak error memory of one micro-batch
  double err_save = 0;  // M_err^save: errors kept for curvature B, one micro-batch
  double kron = 0;      // M_curv = M_inv: Kronecker factors of the stage
  double deferred = 0;  // M_W: output gradients kept from I until W, one micro-batch (split backward)
};

struct MemoryReport {
  int device = 0;              // the worst device (largest M_pipe + M_kfac+)
  double params = 0;           // 2 * copies * M_theta (parameters and gradients)
  double activations = 0;      // N * M_act (+ N * M_W with a split backward)
  double err_peak = 0;
  double m_pipe = 0;
  double activations_in_flight = 0;
  double m_pipe_in_flight = 0;
  double curv = 0, inv = 0, err_save = 0;
  double m_kfac = 0;           // M_kfac+
};

// The memory of `blocks` transformer blocks of `m` at micro-batch size B, 4-byte floats, in MB
// (2^20 bytes), estimated from the shapes (n = B * seq_len tokens, h hidden, f ffn, H heads) for
// `plan` without a measured profile:
//   M_theta    the blocks' weights and biases (4h^2 + 2hf + 9h + f per block, either arch)
//   M_act      what a block's forward keeps for its backward: the inputs of its Linears and
//              LayerNorms, q, k, v, the GELU input, n (9h + 2f), and the softmax, B H T^2
//   M_err^peak one micro-batch's largest error buffers, n (2h + f) + B H T^2
//   M_err^save the Linears' output errors kept for curvature B, n * sum(d_out)
//   M_curv     the Kronecker factors, sum(d_in^2 + d_out^2)
//   M_W        the Linears' output gradients a split backward keeps for W: every Linear's, as
//              M_err^save, n * sum(d_out)
StageMemory block_memory(const ModelConfig& m, int blocks, int micro_batch_size);

// `stages` has one entry per stage or a single entry for uniform stages.
MemoryReport memory_model(const Schedule& s, const Timeline& tl, const std::vector<StageMemory>& stages,
                          bool recompute = false);

}  // namespace pf
