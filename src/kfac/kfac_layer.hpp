#pragma once
// K-FAC for one Linear layer y = W x + b (W [d_out, d_in] row-major): the Kronecker factors A
// (inputs) and B (gradients w.r.t. outputs), their damped inverses, and the precondition.
//
// Scaling convention (the empirical Fisher, each token row an example)
// --------------------------------------------------------------------
// A step feeds T token rows to the layer's curvature (over all its micro-batches). The project's
// loss is L = s * sum_t l_t with s = loss_scale = 1/(loss positions n in the global step), so the
// tap's gradient is g_t = dL/dy_t = s * e_t, where e_t = dl_t/dy_t is the gradient of the token's
// own loss. With tokens as examples,
//     A = (1/T) sum_t x_t x_t^T                      = E_t[x x^T]
//     B = (1/T) sum_t e_t e_t^T = 1/(T s^2) sum_t g_t g_t^T = E_t[e e^T]
// (when every token carries a loss, n = T and B = n sum_t g_t g_t^T). Each micro-batch adds
// x^T x * curvature_scale(T, s).a and g^T g * curvature_scale(T, s).b. Then, for the row-major
// flattening w = vec_rowmajor(W) (index o*d_in + i), the per-token gradient dW_t = e_t x_t^T has
//     (1/T) sum_t w'_t w'_t^T  ~=  kron(B, A)        (w'_t = vec_rowmajor(dW_t))
// with equality for one example (T = 1, s = 1) and whenever all x_t or all e_t are equal; in
// general kron(B, A) = E_t E_u [vec(e_t x_u^T) vec(e_t x_u^T)^T], the K-FAC independence
// assumption. The Fisher is thus per example: its scale does not depend on batch size, so the
// damping gamma means the same at any batch size (as ASDL's, which divides both factors by the
// number of examples).
//
// Damping: pi-corrected Tikhonov, A + sqrt(gamma) pi I and B + sqrt(gamma)/pi I with
// pi = sqrt((tr A / d_in) / (tr B / d_out)) (pi = 1 while either trace is not positive).
//
// Bias: its gradient sum_t g_t is preconditioned by B^-1 alone (ASDL). The alternative appends a
// 1 to every input (an augmented A of size d_in + 1, KAISA): the bias's own block of
// kron(B, A_aug) is B * E[1] = B, so B^-1 alone is the augmented form without the weight-bias
// cross terms, and keeps A's size d_in (what the planner's d^3 costs assume).
//
// The work units (curvature A / B per micro-batch, commit, inversion of A / B or of one block,
// precondition) are separate calls for PipeFisher to place; update_curvature / update_inverse
// are the single-process conveniences. No heap allocation after construction in curvature and
// precondition (workspaces are preallocated).
#include "kfac/factor.hpp"
#include "nn/param.hpp"

#include <cstdint>
#include <string>

namespace pf {

// Per-micro-batch multipliers of x^T x and g^T g (see the convention above).
struct CurvatureScale {
  float a = 1.0f;
  float b = 1.0f;
};
// tokens: T, the rows fed to curvature in the step (all micro-batches, all replicas that
// all-reduce the factors); loss_scale: s, the head's multiplier of summed token losses.
CurvatureScale curvature_scale(int64_t tokens, double loss_scale);

// pi of the pi-corrected damping; 1 when a trace is not positive and finite.
double pi_damping(double trace_a, int64_t d_a, double trace_b, int64_t d_b);

struct KfacLayerOptions {
  double ema_decay = 0.0;     // factor EMA decay; 0 = factors from the latest step only
  int64_t diag_limit = 10000; // B keeps only its diagonal when d_out > diag_limit (ASDL's default)
  int blocks_a = 1;           // block-diagonal approximation of A with this many blocks
  int blocks_b = 1;           // the same for B (ignored when B is diagonal)
  int max_retries = 3;        // damping raises (x10) when a Cholesky fails
};

enum class Side { A, B };
// The one mapping of a side to an index (arrays [side], records, checkpoints): A = 0, B = 1.
inline int side_index(Side s) { return s == Side::A ? 0 : 1; }
inline Side side_at(int index) { return index == 0 ? Side::A : Side::B; }
inline Side other_side(Side s) { return s == Side::A ? Side::B : Side::A; }

class KfacLayer {
 public:
  // name: the layer's name (e.g. "bert.encoder.layer.0.output.dense").
  KfacLayer(std::string name, int64_t d_in, int64_t d_out, const KfacLayerOptions& opt = {});

  const std::string& name() const { return name_; }
  int64_t d_in() const { return d_in_; }
  int64_t d_out() const { return d_out_; }
  bool diagonal_b() const { return b_.diagonal(); }
  KfacFactor& factor(Side s) { return s == Side::A ? a_ : b_; }
  const KfacFactor& factor(Side s) const { return s == Side::A ? a_ : b_; }
  const KfacFactor& a() const { return a_; }
  const KfacFactor& b() const { return b_; }

  // --- curvature work units (one micro-batch; x: [rows, d_in], g: [rows, d_out] row-major) ---
  void curvature_a(const float* x, int64_t rows, const CurvatureScale& s) { a_.accumulate(x, rows, d_in_, s.a); }
  void curvature_b(const float* g, int64_t rows, const CurvatureScale& s) { b_.accumulate(g, rows, d_out_, s.b); }
  // After all micro-batches of the step (and any curvature sync): the sums become the factors.
  bool finish_curvature(Side s) { return factor(s).commit(); }
  // Single-process convenience: both factors from one micro-batch.
  void update_curvature(const float* x, const float* g, int64_t rows, const CurvatureScale& s);
  void finish_curvature() { a_.commit(); b_.commit(); }

  // --- inversion work units ---
  // Damping of each side for gamma, from the current traces (pi-corrected).
  double pi() const { return pi_damping(a_.trace(), d_in_, b_.trace(), d_out_); }
  double damping(Side s, double gamma) const;
  InvertResult invert(Side s, double gamma) { return factor(s).invert(damping(s, gamma)); }
  InvertResult invert_block(Side s, int block, double gamma) { return factor(s).invert_block(block, damping(s, gamma)); }
  // Both sides; returns the worse result.
  InvertResult update_inverse(double gamma);
  // Cost units for a planner (d^2 per token for curvature, d^3 per inversion; see factor.hpp).
  double curvature_cost(Side s, int64_t rows) const;
  double inversion_cost(Side s) const;
  double inversion_cost_block(Side s, int block) const;

  // --- precondition work unit ---
  // weight.grad [d_out, d_in] <- B^-1 G A^-1; bias->grad [d_out] <- B^-1 g_b (bias may be null).
  // Records v.g (preconditioned . raw, weight and bias) for the KL-clip: last_vg().
  void precondition(Param& weight, Param* bias);
  double last_vg() const { return last_vg_; }
  // v.g of this layer preconditioned elsewhere (PipeFisher's precondition split among a stage's holders).
  void set_last_vg(double vg) { last_vg_ = vg; }

  // --- checkpoints: "<name>.kfac.A", ".A_inv", ".A_counters", the same for B ---
  NamedTensors state() const;
  void load_state(const NamedTensors& in);

 private:
  std::string name_;
  int64_t d_in_, d_out_;
  KfacFactor a_, b_;
  Tensor tmp_;      // B^-1 G [d_out, d_in]
  Tensor chunk_;    // rows of (B^-1 G) A^-1 before they overwrite G [kChunk, d_in]
  Tensor bias_tmp_; // B^-1 g_b [d_out]
  double last_vg_ = 0;
};

// KL-clip (KAISA): nu = min(1, sqrt(kappa / |vg_sum * lr^2|)), vg_sum = sum over all K-FAC layers
// (all stages) of preconditioned . raw gradient; 1 when vg_sum is 0.
double kl_clip_scale(double vg_sum, double lr, double kappa);

struct KfacTarget {
  KfacLayer* layer = nullptr;
  Param* weight = nullptr;
  Param* bias = nullptr;  // may be null
};
// Scales every target's preconditioned gradients by kl_clip_scale over their last_vg(); returns nu.
// (A pipeline sums last_vg() across stages itself and scales with scale_gradients.)
double kl_clip(const KfacTarget* targets, size_t count, double lr, double kappa);
void scale_gradients(Param& weight, Param* bias, float nu);

}  // namespace pf
