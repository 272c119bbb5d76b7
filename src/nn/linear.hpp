#pragma once
// Linear layer y = x W^T + b, W stored [out, in] as PyTorch's nn.Linear (GPT-2's Conv1D layout,
// [in, out] in Hugging Face files, is handled at file I/O by Param::hf_transposed, not here).
//
// K-FAC taps. K-FAC needs, per micro-batch, each Linear's input activations x [tokens, in] (for
// the factor A = x^T x) and the gradient of the loss w.r.t. its output g [tokens, out] (for
// B = g^T g). A LinearTap set with set_tap() receives both; with no tap (the default) nothing is
// copied or computed. The pointers are valid only during the call: copy or consume them there.
// on_input is called from forward, on_grad_output from backward_input (I), on the calling thread.
// `tokens` is the number of rows this layer actually saw (the MLM head sees only masked tokens).
#include "nn/param.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace pf {

class Linear;

struct LinearTap {
  virtual ~LinearTap() = default;
  virtual void on_input(const Linear& layer, int micro_batch, const float* x, int64_t rows, int64_t cols) = 0;
  virtual void on_grad_output(const Linear& layer, int micro_batch, const float* g, int64_t rows,
                              int64_t cols) = 0;
};

class Linear {
 public:
  // Owns its weight [out, in] (named `weight_name`) and, if bias_name is not empty, its bias [out].
  Linear(std::string weight_name, std::string bias_name, int64_t in, int64_t out, bool hf_transposed = false);
  // Uses a weight owned elsewhere (the tied word embedding): no copy.
  Linear(Param* shared_weight, std::string bias_name);

  // x [rows, in] -> y [rows, out]
  void forward(int micro_batch, const float* x, int64_t rows, float* y) const;
  // The backward in zero-bubble's two parts (Qi et al. 2024), dy [rows, out]:
  // backward_input (I): dx [rows, in] = dy W (+= when accumulate_dx); K-FAC's tap sees dy here.
  void backward_input(int micro_batch, const float* dy, int64_t rows, float* dx, bool accumulate_dx = false);
  // backward_weight (W): dW += dy^T x, db += colsum(dy), x [rows, in] the forward's input.
  void backward_weight(const float* dy, const float* x, int64_t rows);
  // The same products into buffers of the weight's and the bias's shapes (db ignored without a
  // bias): dw (=, or += when accumulate) dy^T x, db likewise colsum(dy). A weight gradient kept
  // aside until W (the head's, whose softmax gradient exists only during its forward).
  void weight_gradient_into(const float* dy, const float* x, int64_t rows, float* dw, float* db, bool accumulate) const;

  const std::string& name() const { return weight_->name; }  // stable: the weight's param name
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  Param& weight() { return *weight_; }
  const Param& weight() const { return *weight_; }
  Param* bias() { return bias_; }
  const Param* bias() const { return bias_; }
  bool owns_weight() const { return own_weight_ != nullptr; }
  void set_tap(LinearTap* tap) { tap_ = tap; }
  // The layer feeds only a loss that is a mean over its own rows (BERT's NSP head: one row per
  // sequence), not the head's loss_scale x sum: K-FAC then scales its B factor with s = 1/rows
  // (kfac/kfac_layer.hpp's convention with the layer's own loss scale).
  void set_row_mean_loss(bool on) { row_mean_loss_ = on; }
  bool row_mean_loss() const { return row_mean_loss_; }
  LinearTap* tap() const { return tap_; }

 private:
  int64_t in_, out_;
  std::unique_ptr<Param> own_weight_, own_bias_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  LinearTap* tap_ = nullptr;
  bool row_mean_loss_ = false;
};

}  // namespace pf
