#pragma once
// The optimizers: SGD with momentum, AdamW, NVLAMB (NVIDIA's BERT recipe) and SOAP (Adam in
// Shampoo's eigenbasis on the Linear weights, AdamW on the rest).
//
// An optimizer updates Param::value from whatever Param::grad holds: the loss gradient, or the
// K-FAC preconditioned gradient written over it. It never clears gradients (the training loop does).
//
// Per-parameter state is allocated once, by init() or the first step() (SOAP's scratch by its
// first step); a later step allocates nothing.
// Every step first measures the global gradient norm (in double, over fixed-size chunks combined
// in a fixed order, so the bits do not depend on the thread count); mirrors are left out of it,
// their owner counts once. When the norm exceeds `grad_clip` (> 0) the gradients are scaled by
// grad_clip / norm inside the update (NVLAMB's pre-normalisation; clip_grad_norm_ for the others);
// Param::grad itself is not modified; a non-finite norm skips the update altogether (parameters,
// state and step count stay as they were: a NaN/Inf gradient never reaches the weights; the
// training loop reports it). Mirrors are stepped like any parameter: given the same
// gradient and state as their owner they stay equal to it.
#include "config/config.hpp"
#include "core/tensor.hpp"
#include "nn/param.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pf {

namespace optim_detail {
struct SoapScratch;  // soap.cpp
}

class Optimizer {
 public:
  explicit Optimizer(double grad_clip) : grad_clip_(grad_clip) {}
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  // Binds the optimizer to these parameters (in this order) and allocates zeroed state. Called by
  // the first step(); call it yourself before importing checkpointed state.
  void init(std::span<Param* const> params);
  bool initialized() const { return !slots_.empty(); }

  // One update with learning rate `lr`. The params must be those given to init(), in order.
  void step(std::span<Param* const> params, double lr);
  // The same with the global gradient norm supplied by the caller (a pipeline stage passes the
  // norm reduced over all stages: sqrt of the sum of every stage's grad_sq_norm()).
  void step(std::span<Param* const> params, double lr, double grad_norm);
  // Sum of squared gradient entries of these params, mirrors excluded; double, fixed order.
  double grad_sq_norm(std::span<Param* const> params);
  // The factor step() applies to the gradients for a given global norm.
  double clip_scale(double grad_norm) const;

  // State for checkpoints, named "<param name>.<state>" (PyTorch's state names: exp_avg,
  // exp_avg_sq, momentum_buffer). The pointers stay valid; import by writing into them.
  std::vector<std::pair<std::string, Tensor*>> state_tensors();
  // Brings work the optimizer deferred up to date, before state_tensors() is read for a
  // checkpoint (SOAP's statistics one step late); the next step's result does not change.
  virtual void settle() {}
  // Number of steps taken (Adam's bias correction uses it); part of the checkpointed state.
  int64_t step_count() const { return steps_; }
  void set_step_count(int64_t n) { steps_ = n; }

 protected:
  struct Slot {
    Param* param = nullptr;
    std::vector<Tensor> state;        // one per state_specs() entry
    std::vector<std::string> names;   // their names ("exp_avg", ...)
    std::vector<double> partial;      // per-chunk partial sums for this param's norms (2 per chunk)
  };
  // A per-parameter state tensor: its name and shape.
  struct StateSpec {
    std::string name;
    Shape shape;
  };
  // Names of the per-parameter state tensors, e.g. {"exp_avg", "exp_avg_sq"}, each shaped like
  // the parameter.
  virtual std::vector<std::string> state_names() const = 0;
  // The state tensors of one parameter: by default state_names(), each shaped like it.
  virtual std::vector<StateSpec> state_specs(const Param& p) const;
  // Updates one parameter; `t` is the step number counting this one (1 for the first step) and
  // `grad_scale` the clipping factor to apply to its gradient.
  virtual void update(Slot& slot, double lr, int64_t t, float grad_scale) = 0;
  std::vector<Slot>& slots() { return slots_; }  // empty before init()

 private:
  double grad_clip_;
  std::vector<Slot> slots_;
  int64_t steps_ = 0;
};

// p -= lr * buf, buf = momentum * buf + (g + weight_decay * p) (L2 decay on decay params only;
// PyTorch's SGD without dampening or Nesterov).
class Sgd : public Optimizer {
 public:
  Sgd(double momentum, double weight_decay, double grad_clip)
      : Optimizer(grad_clip), momentum_(momentum), weight_decay_(weight_decay) {}
  std::string name() const override { return "sgd"; }

 protected:
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  void update(Slot& slot, double lr, int64_t t, float grad_scale) override;

 private:
  double momentum_, weight_decay_;
};

// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW): p *= 1 - lr * weight_decay (decay
// params only), then p -= lr * m_hat / (sqrt(v_hat) + eps), bias-corrected moments.
class AdamW : public Optimizer {
 public:
  AdamW(double beta1, double beta2, double eps, double weight_decay, double grad_clip)
      : Optimizer(grad_clip), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {}
  std::string name() const override { return "adamw"; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(Slot& slot, double lr, int64_t t, float grad_scale) override;
  double beta1_, beta2_, eps_, weight_decay_;  // SOAP's too
};

// NVLAMB as in NVIDIA's BERT recipe (apex FusedLAMB with use_nvlamb): on the pre-normalised
// gradient g, m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, u = m_hat / (sqrt(v_hat) + eps)
// + weight_decay * p (decay params only), then per tensor p -= lr * (||p|| / ||u||) * u, the
// trust ratio taken as 1 when either norm is 0. Applied to every tensor, biases included.
class NvLamb : public Optimizer {
 public:
  NvLamb(double beta1, double beta2, double eps, double weight_decay, double grad_clip)
      : Optimizer(grad_clip), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {}
  std::string name() const override { return "nvlamb"; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void update(Slot& slot, double lr, int64_t t, float grad_scale) override;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
};

// SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"; the authors'
// soap.py) on each Linear's weight G [m, n] (Param::linear); every other parameter is AdamW's
// with the same rate, betas and eps. Per weight: L = b L + (1 - b) G G^T and R = b R + (1 - b)
// G^T G (b = shampoo_beta), their eigenbases Q_L, Q_R (columns by decreasing eigenvalue), and
// Adam's moments of the rotated gradient G' = Q_L^T G Q_R. The first step of a weight only
// gathers L, R and computes Q_L, Q_R by LAPACK's ssyevd (the weight does not move, as soap.py:
// the current gradient never enters its own projection). Each later step t (counted from that
// one): m = b1 m + (1 - b1) G', v = b2 v + (1 - b2) G'^2, p -= lr sqrt(1 - b2^t) / (1 - b1^t)
// Q_L (m / (sqrt(v) + eps)) Q_R^T, then p *= 1 - lr * weight_decay (decay params), then L and R
// take G, and every precondition_frequency steps the bases move by one power iteration with QR
// (soap.py's get_orthogonal_matrix_QR): columns sorted by the estimated eigenvalues diag(Q^T L Q),
// v's rows or columns permuted alike (v is not rotated), Q = qr(L Q). m is carried over: rotated
// back with the old bases and into the new ones (soap.py does that round trip every step; here
// only when the bases change, the same arithmetic up to rounding). A side longer than
// max_precond_dim has no statistic and is not rotated; with neither side this is Adam.
//
// SOAP's work as units (kfac.placement = bubbles, replay: docs/optimizers.md): with
// refresh_by_units the bases move only when refresh_factor asks, one factor at a time, and never
// every precondition_frequency steps. A factor's refresh between two updates is one power
// iteration of its basis on its statistic as the last update left it, its side of m rotated out
// of the old basis and into the new one, v's rows (L) or columns (R) permuted alike: the
// arithmetic of the refresh after that update (which rotates m over both sides at once, the same
// up to rounding), so a refresh run anywhere before the next update is the same refresh.
// With defer_statistics (bubbles, from the first planned step) an update keeps its weight's
// gradient instead of adding it to L and R at its end, and update_statistics adds it later (STAT,
// in the next step's bubbles): the statistics lag one step while nothing reads them. Whatever reads
// a statistic first adds what is pending for it (a refresh its side, the next update, settle all),
// so every reader sees what inline SOAP's would: the same bits.
class Soap : public AdamW {
 public:
  explicit Soap(const OptimConfig& c);
  ~Soap() override;
  std::string name() const override { return "soap"; }

  // The weights SOAP rotates (a Linear's own weight) among `params`, in order: unit layer l of
  // a stage is the l-th of its parameters.
  static std::vector<int> rotated_weights(std::span<Param* const> params);
  void refresh_by_units(bool on) { by_units_ = on; }
  // precond.placement = skip (PlacementSpec::statistics_at_refreshes_only): L and R take a
  // gradient only on the first step and the steps whose end refreshes the bases (k % frequency
  // = 0), so the steps between pay only the rotations.
  void statistics_at_refreshes_only(bool on) { refresh_steps_only_ = on; }
  // Refreshes factor `side` (0: L, 1: R) of rotated weight `weight` (an index of
  // rotated_weights). A side longer than max_precond_dim has none, and before the first step
  // (whose eigensolver makes the bases) there is none yet: then nothing happens.
  void refresh_factor(int weight, int side);
  // The same refresh timed on copies (the state is left as it was), in ms: a plan's unit cost.
  double time_refresh_factor(int weight, int side);
  // The rotated weight's side has a statistic and a basis.
  bool has_factor(int weight, int side);
  void defer_statistics(bool on) { defer_ = on; }
  // Adds rotated weight `weight`'s pending gradient to its statistics (a STAT unit).
  void update_statistics(int weight) { add_pending(rotated_index(weight), -1); }
  // That work on copies of the weight's statistics, its last gradient taken (the state is left as
  // it was), in ms: a plan's STAT cost.
  double time_statistics(int weight);
  // Adds every pending gradient (before a checkpoint reads the state).
  void settle() override;

 protected:
  std::vector<StateSpec> state_specs(const Param& p) const override;
  void update(Slot& slot, double lr, int64_t t, float grad_scale) override;

 private:
  void update_matrix(Slot& slot, double lr, int64_t t, float grad_scale);
  // A weight's gradient kept for its statistics (defer_statistics), per side still to add.
  struct Pending {
    std::vector<float> grad;
    float scale = 1;
    bool side[2] = {false, false};
  };
  void hold_gradient(size_t slot, float grad_scale);
  void add_pending(size_t slot, int side);  // side -1: both
  size_t rotated_index(int weight);         // its slot
  Slot& rotated_slot(int weight) { return slots()[rotated_index(weight)]; }
  double shampoo_beta_;
  int precondition_frequency_, max_precond_dim_;
  bool by_units_ = false, defer_ = false, refresh_steps_only_ = false;
  std::vector<Pending> pending_;  // [slot], sized by the first deferred update
  // Sized on the first step for the largest weight: later steps allocate nothing.
  std::unique_ptr<optim_detail::SoapScratch> scratch_;
};

// optim.name: nvlamb | adamw | sgd | soap, with the config's hyper-parameters.
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg);
// A run's optimizer: the same, SOAP's statistics gathered as precond.placement says (skip: only on
// its refresh steps).
std::unique_ptr<Optimizer> make_optimizer(const Config& cfg);

}  // namespace pf
