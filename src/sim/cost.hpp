#pragma once
// Durations of actions: per stage (one entry = uniform stages), point-to-point messages
// (latency + bytes / bandwidth) and collectives (alpha + beta * bytes). Times are in whatever
// unit the caller uses (the CLI: milliseconds); bytes in bytes.
#include "schedule/action.hpp"
#include "schedule/zb_auto.hpp"

#include <vector>

namespace pf {

struct StageCost {
  double forward = 1;
  double backward = 2;
  double input_grad = -1;   // I; < 0 means backward / 2
  double weight_grad = -1;  // W; < 0 means backward / 2
  double curvature = 0;     // all curvature work of the stage for one micro-batch (A and B, all layers)
  double inversion = 0;     // all inversions of the stage
  double precondition = 0;
  double optimizer = 0;
  int layers = 1;           // per-layer K-FAC actions take curvature / (2 layers), inversion / (2 layers)
  double activation_bytes = 0;  // one stage-to-stage message (activation or its gradient)
  double grad_bytes = 0;        // gradients of the stage (ALLREDUCE)
  double curvature_bytes = 0;   // Kronecker factors of the stage (SYNC_CURV)
};

struct CostModel {
  std::vector<StageCost> stages = std::vector<StageCost>(1);  // [stage], or one entry for uniform stages
  double p2p_latency = 0;
  double p2p_bandwidth = 0;  // bytes per time unit; 0 = infinite
  double allreduce_alpha = 0;
  double allreduce_beta = 0;  // time per byte

  const StageCost& stage(int s) const { return stages.size() == 1 ? stages[0] : stages.at(s); }
  double duration(const Action& a) const;  // device time of one action (0 for SEND/RECV)
  double p2p_time(int stage) const;        // one message leaving `stage`
  // T_b / T_f summed over the stages, what Chimera's order is chosen for (2 without durations).
  double backward_forward_ratio() const;
};

// The share of a transformer block's backward that is its weight gradient (W), by multiply-adds
// per token: the Linears' weight gradients (L = 4 h^2 + 2 h f) over the whole backward, whose
// input gradient is L plus attention's score and value products (4 s h: two products of s h
// each, both of their inputs' gradients). Splits a backward measured whole (the paper's CSV
// profiles give only T_b) into I and W.
double weight_grad_share(int hidden, int ffn, int seq_len);

// The times zb-auto and zb-v are ordered for (one micro-batch's F, I and W, averaged over the
// stages, and one message between devices), with the memory limit X.
ZbSpec zb_spec(const CostModel& cost, double memory);

// Activation recomputation (R, parallel.recompute): every backward (ZB-H1: its I, which runs
// first) repeats the stage's forward. For costs measured without R.
void add_recomputation(CostModel& cost);

}  // namespace pf
