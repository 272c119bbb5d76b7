#include "nn/linear.hpp"

#include "core/blas.hpp"
#include "core/kernel_clock.hpp"
#include "core/kernels.hpp"

#include <algorithm>

namespace pf {

Linear::Linear(std::string weight_name, std::string bias_name, int64_t in, int64_t out, bool hf_transposed)
    : in_(in), out_(out) {
  own_weight_ = std::make_unique<Param>(std::move(weight_name), Shape{out, in});
  own_weight_->hf_transposed = hf_transposed;
  own_weight_->linear = true;
  weight_ = own_weight_.get();
  if (!bias_name.empty()) {
    own_bias_ = std::make_unique<Param>(std::move(bias_name), Shape{out}, /*decay=*/false);
    bias_ = own_bias_.get();
  }
}

Linear::Linear(Param* shared_weight, std::string bias_name)
    : in_(shared_weight->value.dim(1)), out_(shared_weight->value.dim(0)), weight_(shared_weight) {
  if (!bias_name.empty()) {
    own_bias_ = std::make_unique<Param>(std::move(bias_name), Shape{out_}, /*decay=*/false);
    bias_ = own_bias_.get();
  }
}

void Linear::forward(int micro_batch, const float* x, int64_t rows, float* y) const {
  // x is (rows, in), W is (out, in), y will be (rows, out)
  if (tap_) tap_->on_input(*this, micro_batch, x, rows, in_);
  KernelScope clock(Kernel::block_products, 0, 2.0 * rows * out_ * in_);
  float beta = 0.0f;
  if (bias_) {
    broadcast_rows(y, bias_->value.data(), rows, out_);
    beta = 1.0f;
  }
  // One row (a token decoded with the KV cache): a matrix-vector product, which reads W once
  // instead of packing it (training's rows are tokens x sequences, never 1).
  if (rows == 1) gemv(out_, in_, 1.0f, weight_->value.data(), in_, x, beta, y);
  else gemm(false, true, rows, out_, in_, 1.0f, x, in_, weight_->value.data(), in_, beta, y, out_);
}

void Linear::backward_input(int micro_batch, const float* dy, int64_t rows, float* dx, bool accumulate_dx) {
  // dy is (rows, out), W is (out, in): dx (rows, in) = dy W
  if (tap_) tap_->on_grad_output(*this, micro_batch, dy, rows, out_);
  KernelScope clock(Kernel::block_products, 0, 2.0 * rows * out_ * in_);
  gemm(false, false, rows, in_, out_, 1.0f, dy, out_, weight_->value.data(), in_, accumulate_dx ? 1.0f : 0.0f, dx,
       in_);
}

void Linear::backward_weight(const float* dy, const float* x, int64_t rows) {
  weight_gradient_into(dy, x, rows, weight_->grad.data(), bias_ ? bias_->grad.data() : nullptr, true);
}

void Linear::weight_gradient_into(const float* dy, const float* x, int64_t rows, float* dw, float* db,
                                  bool accumulate) const {
  // dy is (rows, out), x is (rows, in): dW (out, in) += dy^T x; db (out) += sum_rows dy
  KernelScope clock(Kernel::block_products, 0, 2.0 * rows * out_ * in_);
  gemm(true, false, out_, in_, rows, 1.0f, dy, out_, x, in_, accumulate ? 1.0f : 0.0f, dw, in_);
  if (!bias_) return;
  if (!accumulate) std::fill(db, db + out_, 0.0f);
  col_sum_accumulate(db, dy, rows, out_);
}

}  // namespace pf
