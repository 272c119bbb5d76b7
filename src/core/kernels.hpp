#pragma once
// Kernels for what is not a matrix product: written for speed (contiguous inner loops the compiler
// vectorizes; OpenMP across rows with a static schedule). Every row's result is computed by one
// thread in a fixed order, and reductions across rows run per column in row order, so results are
// the same bits for any thread count. Pointers are raw: callers own fp32 row-major buffers.
#include "core/gelu.hpp"

#include <bit>
#include <cstdint>

namespace pf {

// exp(x) in a form GCC vectorizes (Cephes' expf: range reduction by ln 2 and a degree-6
// polynomial, about 1 ulp). Inputs below -87 give ~1e-38 rather than 0. Branch-free: rounding by
// the 1.5 * 2^23 trick (floorf would not vectorize), the exponent built from the same bits.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  float t = x * 1.44269504088896341f + 12582912.0f;  // round(x / ln 2) in the low mantissa bits
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (std::bit_cast<int32_t>(t) - 0x4B400000 + 127) << 23;  // 2^n
  return p * std::bit_cast<float>(e);
}

// erf(x) to ~1.2e-7 (Numerical Recipes' erfc Chebyshev fit), vectorizable.
inline float fast_erf(float x) {
  float z = __builtin_fabsf(x);
  float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float r = 1.0f - t * fast_exp(-z * z + p);
  return __builtin_copysignf(r, x);
}

inline float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

// --- elementwise ---
void add(float* out, const float* a, const float* b, int64_t n);  // out = a + b
void add_inplace(float* a, const float* b, int64_t n);            // a += b
void scale_inplace(float* a, float s, int64_t n);                 // a *= s
// out[r, :] = bias for every row (the start of a biased matrix product).
void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols);

// --- reductions ---
// acc[c] += sum_r x[r, c] (bias gradients), per column in row order.
void col_sum_accumulate(float* acc, const float* x, int64_t rows, int64_t cols);
// sum x^2 in double, over fixed chunks (same bits for any thread count).
double sum_squares(const float* x, int64_t n);

// --- softmax of one row, in place: the one softmax of attention and the cross-entropy ---
// Over the entries j < visible (with key_mask, only those where key_mask[j] != 0); every other
// entry of the row's n becomes exactly 0, and a row with nothing visible becomes all 0.
// Returns the visible maximum and sum(exp(x - max)): the log-partition is max + log(sum).
// Example: x = {1, 2, 9}, n = 3, visible = 2 gives {0.269, 0.731, 0}, max 2, sum 1.368.
struct SoftmaxRow {
  float max;
  float sum;
};
SoftmaxRow softmax_row(float* x, int64_t n, int64_t visible, const uint8_t* key_mask = nullptr);

// --- LayerNorm over the last dimension C ---
// inp, out: [rows, C]; weight, bias: [C]; mean, rstd: [rows] (kept for the backward).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t C, float eps);
// dinp (= or += when accumulate) [rows, C]; dweight, dbias += [C].
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C,
                        bool accumulate);

// --- RMSNorm over the last dimension C (Llama: no mean, no bias) ---
// out = inp * rstd * weight with rstd [rows] = 1 / sqrt(mean(inp^2) + eps), kept for the backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int64_t C, float eps);
// dinp (= or += when accumulate) [rows, C]; dweight += [C].
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t rows, int64_t C, bool accumulate);

// --- SwiGLU (Llama's MLP between its up and down projections) ---
// gate, up, out: [rows, F] at row stride ld (gate and up may be halves of one [rows, 2F] buffer);
// out = silu(gate) * up, silu(z) = z / (1 + exp(-z)).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t F, int64_t ld);
// From dout [rows, F]: dgate = dout * up * silu'(gate), dup = dout * silu(gate), written at row
// stride ld (dgate or dup may not alias dout).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t rows,
                     int64_t F, int64_t ld);

// --- GELU: erf form (BERT) and tanh form (GPT-2), core/gelu.hpp ---
void gelu_forward(float* out, const float* inp, int64_t n, Gelu kind);
// dinp = dout * gelu'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, Gelu kind);

// --- softmax cross-entropy, fused ---
// logits [rows, V] become probabilities in place; loss[r] = -log p[r, label[r]] (labels >= 0).
void softmax_cross_entropy_forward(float* logits, float* loss, const int32_t* labels, int64_t rows,
                                   int64_t V);
// probs [rows, V] become dlogits = (p - onehot(label)) * scale in place.
void softmax_cross_entropy_backward(float* probs, const int32_t* labels, int64_t rows, int64_t V, float scale);
// Both in one pass over the rows: logits become dlogits and loss is the forward's, the same
// operations as forward then backward, each row's scaling done while the row is in cache.
void softmax_cross_entropy_with_grad(float* logits, float* loss, const int32_t* labels, int64_t rows, int64_t V,
                                     float scale);

}  // namespace pf
