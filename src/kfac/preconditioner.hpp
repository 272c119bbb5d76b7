#pragma once
// K-FAC over the Linear layers of a model or of one pipeline stage: which layers, when their
// curvature and inverses are refreshed, and the per-layer work units (curvature, inversion,
// precondition) that a single-process trainer calls in order and a pipeline runtime places in
// its bubbles. Each KfacLayer keeps its own state, so a stage holds only its own layers.
//
// Layers: every Linear given, except the one whose output is the vocabulary (the LM decoder: B
// would be vocab^2, and its weight is the tied word embedding); embeddings are not Linear. B is
// kept diagonal for layers with more than kfac.diag_limit outputs (KfacLayer).
//
// Curvature (the empirical Fisher, tokens as examples; the convention of kfac_layer.hpp): the
// driver is a LinearTap. While attached, every forward of a K-FAC layer adds x^T x of the
// micro-batch's inputs to A and every backward adds g^T g of the gradients w.r.t. its outputs
// to B, unscaled, counting the rows. finish_curvature() then scales the step's sums by
// curvature_scale(T, s) (T = the rows counted, s = the loss scale) and commits them: the same
// factors as scaling each micro-batch, without knowing T before the step (the MLM head's layers
// see only the masked tokens, the blocks every token). A data-parallel sync all-reduces the
// accumulators and passes the global row count.
//
// Refresh pattern: the caller's (kfac/cadence.hpp for an inline refresh, PipeFisher's plan in a
// pipeline). Between refreshes the previous inverses precondition every step.
//
// The precondition of every layer runs every step: G <- B^-1 G A^-1, bias <- B^-1 g_b. The base
// optimizer then sees these gradients for K-FAC layers and the plain ones for every other param.
#include "config/config.hpp"
#include "kfac/kfac_layer.hpp"
#include "nn/linear.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace pf {

// Outcome of inverting every factor once.
struct InversionSummary {
  int factors = 0;   // factors inverted
  int raised = 0;    // Cholesky failed at first: inverted with raised damping
  int kept = 0;      // failed or non-finite: the previous inverse stays
  int retries = 0;   // damping raises in total
};

class KfacPreconditioner final : public LinearTap {
 public:
  // linears: the model's (or stage's) Linear layers; vocab: the model's vocabulary size (a
  // layer with that many outputs is the decoder and is skipped).
  KfacPreconditioner(const std::vector<Linear*>& linears, const KfacConfig& cfg, int64_t vocab);
  ~KfacPreconditioner() override;

  size_t size() const { return layers_.size(); }
  KfacLayer& layer(size_t i) { return *layers_[i].kfac; }
  const KfacLayer& layer(size_t i) const { return *layers_[i].kfac; }
  Linear& linear(size_t i) { return *layers_[i].linear; }
  const std::vector<std::string>& skipped() const { return skipped_; }  // names of Linears left out
  // Index of a K-FAC layer, or -1 when the Linear is not one.
  int index_of(const Linear& l) const;
  const KfacConfig& config() const { return cfg_; }

  // --- taps: attach before the step's forwards, detach after its last backward ---
  void attach();
  void attach(size_t i);  // layer i only (a replay taps only the layers whose factors it uses)
  void detach();
  bool attached() const { return attached_; }
  void on_input(const Linear& l, int micro_batch, const float* x, int64_t rows, int64_t cols) override;
  void on_grad_output(const Linear& l, int micro_batch, const float* g, int64_t rows, int64_t cols) override;

  // --- per-layer work units ---
  // One micro-batch's curvature of one factor: adds x^T x (x: [rows, d] row-major), unscaled.
  void curvature(size_t i, Side s, const float* x, int64_t rows);
  int64_t pending_rows(size_t i, Side s) const { return layers_[i].rows[side_index(s)]; }
  void set_pending_rows(size_t i, Side s, int64_t n) { layers_[i].rows[side_index(s)] = n; }  // checkpoints
  // Scales the step's sum by the convention and commits it. total_rows: T (-1 = the rows counted
  // here; a data-parallel sync passes the sum over replicas). False when nothing was accumulated.
  bool finish_curvature(size_t i, Side s, double loss_scale, int64_t total_rows = -1);
  // Inverse of one factor with pi-corrected damping kfac.damping (never throws on a non-PD factor).
  InvertResult invert(size_t i, Side s);
  // G <- B^-1 G A^-1 and bias <- B^-1 g_b for layer i.
  void precondition(size_t i);

  // --- the same over every layer, in order (single process) ---
  int finish_curvature(double loss_scale);  // returns the factors committed
  InversionSummary invert_all();            // logs a warning when a factor needed more damping
  void precondition_all();
  // KL-clip (kfac.kl_clip > 0): scales every preconditioned gradient by nu; returns nu (1 if off).
  double kl_clip(double lr);
  // KL-clip's pieces for a model split over ranks (the executor sums vg_sum over the stages, then
  // kl_clip_scale): this preconditioner's sum of v.g, and scaling its gradients by nu.
  double vg_sum() const;
  void scale_gradients(double nu);
  // Sum of squares of the targets' gradients (weights and biases): before the precondition, the
  // loss gradient's share in the norm a log compares across optimizers.
  double grad_sq_sum() const;

  // --- checkpoints: every layer's factors, inverses and counters (KfacLayer::state) ---
  NamedTensors state() const;
  void load_state(const NamedTensors& in);

 private:
  struct Entry {
    Linear* linear = nullptr;
    std::unique_ptr<KfacLayer> kfac;
    int64_t rows[2] = {0, 0};  // rows accumulated since the last finish (A, B)
  };
  KfacConfig cfg_;
  std::vector<Entry> layers_;
  std::vector<KfacTarget> targets_;
  std::unordered_map<const Linear*, size_t> index_;
  std::vector<std::string> skipped_;
  bool attached_ = false;
};

}  // namespace pf
