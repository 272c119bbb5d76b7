#pragma once
// The K-FAC work's costs per stage, as the PipeFisher planner (plan/planner.hpp) and the
// simulator's profiles and memory model take them: the K-FAC Linears of a transformer block, and
// block-level costs split into per-factor units (curvature ~ d^2 per token, inversion ~ d^3).
#include "config/config.hpp"
#include "schedule/action.hpp"

#include <string>
#include <vector>

namespace pf {

// A K-FAC Linear layer's shape: A is d_in x d_in, B is d_out x d_out.
struct LinearShape {
  int d_in = 0, d_out = 0;
};
// The K-FAC Linears of one transformer block. bert: q, k, v, attn-out (d x d), intermediate
// (d -> ffn), output (ffn -> d); gpt: c_attn (d -> 3d), c_proj, c_fc (d -> ffn), mlp c_proj;
// llama: q (d x d), k, v (d -> kv, the key/value width, d without grouped-query attention), o,
// gate, up (d -> ffn), down (ffn -> d). UsageError naming --model for another arch.
std::vector<LinearShape> block_linears(const std::string& arch, int hidden, int ffn, int kv = 0);
// The same for a model's shape.
std::vector<LinearShape> block_linears(const ModelConfig& m);

// Durations of one stage's K-FAC work units (per pipeline copy; Chimera's two copies of a stage
// each have their own factors and units). Layer index = position in these vectors.
struct StageKfacCost {
  std::vector<double> curv_a, curv_b;  // [layer] one micro-batch
  std::vector<double> inv_a, inv_b;    // [layer] the whole factor
  std::vector<int> dim_a, dim_b;       // [layer] factor sizes (block splits)
  std::vector<int> diag_b;             // [layer] 1: B kept diagonal (d floats to broadcast); empty: none
  std::vector<double> eig_l, eig_r;    // [layer] SOAP (its rotated weights): a basis refresh, of L and of R
  double precondition = 0;             // PREC of the stage, every step
  std::vector<double> statistics;      // [layer] SOAP (its rotated weights): STAT, every step
  double sync = 0;                     // SYNC_CURV of the stage (used only when replicas > 1)
  // K-FAC's layers, or SOAP's rotated weights (a SOAP stage has no K-FAC unit).
  int layers() const { return static_cast<int>(curv_a.empty() ? eig_l.size() : curv_a.size()); }
  // The cost of unit `kind` (CURV_A/B, INV_A/B, EIG_L/R, STAT: of `layer`; SYNC_CURV, PREC: the stage's).
  double unit(Kind kind, int layer) const;
  double& unit(Kind kind, int layer);
  bool operator==(const StageKfacCost&) const = default;
};

// A stage's measured costs as the planner takes them: every duration times `scale`
// (--test-kfac-cost-scale; 1 otherwise), and the sync never zero: a zero-length SYNC_CURV would tie
// in start time with the inversions after it, and the planner's list order breaks ties by start only.
StageKfacCost planner_cost(const StageKfacCost& measured, double scale = 1);

// The stage's precondition per layer, in proportion to each layer's flops: d_out d_in (d_in +
// d_out) for B^-1 G A^-1 (a diagonal B: d_out d_in (d_in + 1)).
std::vector<double> precondition_by_layer(const StageKfacCost& c);

// Block-level costs split into per-factor units in proportion to the Linear shapes: curvature
// by d^2 (A: d_in^2, B: d_out^2; per token), inversion by d^3. `layers` lists the Linears of all
// blocks of the stage.
StageKfacCost split_stage_cost(const std::vector<LinearShape>& layers, double curvature, double inversion,
                               double precondition, double sync = 0);

// Cost of diagonal block j of a factor of size d split into k blocks, the whole costing `whole`.
double block_cost(double whole, int d, int k, int j);

}  // namespace pf
