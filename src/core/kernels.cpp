#include "core/kernels.hpp"

#include "core/kernel_clock.hpp"
#include "core/parallel.hpp"

#include <algorithm>
#include <cmath>

namespace pf {

namespace {
// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;
// Column reductions work on blocks of this many columns (kept in registers across rows).
constexpr int64_t kColBlock = 64;
}  // namespace

void add(float* out, const float* a, const float* b, int64_t n) {
  KernelScope clock(Kernel::elementwise, 12.0 * n);
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* a, const float* b, int64_t n) {
  KernelScope clock(Kernel::elementwise, 12.0 * n);
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void scale_inplace(float* a, float s, int64_t n) {
  KernelScope clock(Kernel::elementwise, 8.0 * n);
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) a[i] *= s;
}

void broadcast_rows(float* out, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(dynamic, rows_per_piece(cols)) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + cols, out + r * cols);
}

void col_sum_accumulate(float* acc, const float* x, int64_t rows, int64_t cols) {
  int64_t blocks = (cols + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(dynamic, 1) if (rows * cols > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, w = std::min(kColBlock, cols - c0);
    float s[kColBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * cols + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) s[c] += row[c];
    }
    for (int64_t c = 0; c < w; ++c) acc[c0 + c] += s[c];
  }
}

double sum_squares(const float* x, int64_t n) {
  // A fixed number of chunks, whatever the thread count, so the sum's rounding is fixed.
  constexpr int kChunks = 64;
  double part[kChunks];
  int64_t per = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(dynamic, 1) if (n > kParallelMin)
  for (int ch = 0; ch < kChunks; ++ch) {
    int64_t b = std::min(n, ch * per), e = std::min(n, b + per);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    part[ch] = s;
  }
  double total = 0;
  for (double p : part) total += p;
  return total;
}

SoftmaxRow softmax_row(float* x, int64_t n, int64_t visible, const uint8_t* key_mask) {
  float m = -INFINITY;
  if (key_mask) {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < visible; ++j) m = std::max(m, key_mask[j] ? x[j] : -INFINITY);
  } else {
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < visible; ++j) m = std::max(m, x[j]);
  }
  if (m == -INFINITY) {  // nothing visible (an all-padding sequence): attend to nothing
    std::fill(x, x + n, 0.0f);
    return {m, 0.0f};
  }
  float sum = 0;
  if (key_mask) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < visible; ++j) {
      x[j] = key_mask[j] ? fast_exp(x[j] - m) : 0.0f;
      sum += x[j];
    }
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < visible; ++j) {
      x[j] = fast_exp(x[j] - m);
      sum += x[j];
    }
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) x[j] *= inv;
  std::fill(x + visible, x + n, 0.0f);
  return {m, sum};
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t rows, int64_t C, float eps) {
  KernelScope clock(Kernel::norms, 4.0 * (2 * rows * C + 2 * rows));
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    float m = s / C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    float rs = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * rs * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t C,
                        bool accumulate) {
  KernelScope clock(Kernel::norms, 4.0 * (3 + accumulate) * rows * C);
  // Input gradient, row by row: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    float* dx = dinp + r * C;
    float m = mean[r], rs = rstd[r];
    float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
    for (int64_t c = 0; c < C; ++c) {
      float dn = dy[c] * weight[c];
      a += dn;
      b += dn * (x[c] - m) * rs;
    }
    a /= C;
    b /= C;
    if (accumulate) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += rs * (dy[c] * weight[c] - a - (x[c] - m) * rs * b);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] = rs * (dy[c] * weight[c] - a - (x[c] - m) * rs * b);
    }
  }
  // Parameter gradients, per column in row order: dweight += sum dy * xhat, dbias += sum dy.
  int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(dynamic, 1) if (rows * C > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, w = std::min(kColBlock, C - c0);
    float sw[kColBlock] = {}, sb[kColBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = inp + r * C + c0;
      const float* dy = dout + r * C + c0;
      float m = mean[r], rs = rstd[r];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        sw[c] += dy[c] * (x[c] - m) * rs;
        sb[c] += dy[c];
      }
    }
    for (int64_t c = 0; c < w; ++c) {
      dweight[c0 + c] += sw[c];
      dbias[c0 + c] += sb[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t rows, int64_t C, float eps) {
  KernelScope clock(Kernel::norms, 4.0 * (2 * rows * C + rows));
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    float* y = out + r * C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += x[c] * x[c];
    const float rs = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * rs * weight[c];
    rstd[r] = rs;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t rows, int64_t C, bool accumulate) {
  KernelScope clock(Kernel::norms, 4.0 * (3 + accumulate) * rows * C);
  // Input gradient, row by row: dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), dxhat = dy * w.
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    float* dx = dinp + r * C;
    const float rs = rstd[r];
    float b = 0;
#pragma omp simd reduction(+ : b)
    for (int64_t c = 0; c < C; ++c) b += dy[c] * weight[c] * x[c] * rs;
    b /= C;
    if (accumulate) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += rs * (dy[c] * weight[c] - x[c] * rs * b);
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] = rs * (dy[c] * weight[c] - x[c] * rs * b);
    }
  }
  // dweight += sum dy * xhat, per column in row order (the same bits for any thread count).
  int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(dynamic, 1) if (rows * C > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, w = std::min(kColBlock, C - c0);
    float sw[kColBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = inp + r * C + c0;
      const float* dy = dout + r * C + c0;
      const float rs = rstd[r];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) sw[c] += dy[c] * x[c] * rs;
    }
    for (int64_t c = 0; c < w; ++c) dweight[c0 + c] += sw[c];
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t rows, int64_t F, int64_t ld) {
  KernelScope clock(Kernel::activations, 12.0 * rows * F);
#pragma omp parallel for schedule(dynamic, rows_per_piece(F)) if (rows * F > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gate + r * ld, *u = up + r * ld;
    float* o = out + r * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) o[f] = g[f] / (1.0f + fast_exp(-g[f])) * u[f];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t rows,
                     int64_t F, int64_t ld) {
  KernelScope clock(Kernel::activations, 20.0 * rows * F);
#pragma omp parallel for schedule(dynamic, rows_per_piece(F)) if (rows * F > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gate + r * ld, *u = up + r * ld, *d = dout + r * F;
    float *dg = dgate + r * ld, *du = dup + r * ld;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float s = 1.0f / (1.0f + fast_exp(-g[f]));  // sigmoid; silu' = s (1 + z (1 - s))
      const float uf = u[f], df = d[f];
      du[f] = df * g[f] * s;
      dg[f] = df * uf * s * (1.0f + g[f] * (1.0f - s));
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace

// Elementwise work in fixed chunks, one thread per chunk, each a contiguous loop to vectorize.
template <class F>
static void for_chunks(int64_t n, F&& f) {
  constexpr int64_t kChunk = 1 << 14;
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1) if (n > kParallelMin)
  for (int64_t ch = 0; ch < chunks; ++ch) f(ch * kChunk, std::min(n, (ch + 1) * kChunk));
}

void gelu_forward(float* out, const float* inp, int64_t n, Gelu kind) {
  KernelScope clock(Kernel::activations, 8.0 * n);
  if (kind == Gelu::Erf) {
    for_chunks(n, [=](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) out[i] = 0.5f * inp[i] * (1.0f + fast_erf(inp[i] * kInvSqrt2));
    });
  } else {
    for_chunks(n, [=](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      }
    });
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, Gelu kind) {
  KernelScope clock(Kernel::activations, 12.0 * n);
  if (kind == Gelu::Erf) {
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
    for_chunks(n, [=](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + fast_erf(x * kInvSqrt2));
        float pdf = kInvSqrt2Pi * fast_exp(-0.5f * x * x);
        dinp[i] = dout[i] * (cdf + x * pdf);
      }
    });
  } else {
    for_chunks(n, [=](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        float x = inp[i];
        float th = fast_tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
        float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
      }
    });
  }
}

namespace {
// One row of logits to probabilities in place; returns -log p[label].
float softmax_cross_entropy_row(float* x, int32_t label, int64_t V) {
  const float label_logit = x[label];
  const SoftmaxRow z = softmax_row(x, V, V);
  return std::log(z.sum) - (label_logit - z.max);
}

// One row of probabilities to dlogits = (p - onehot(label)) * scale in place.
void softmax_cross_entropy_grad_row(float* p, int32_t label, int64_t V, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) p[j] *= scale;
  p[label] -= scale;
}
}  // namespace

void softmax_cross_entropy_forward(float* logits, float* loss, const int32_t* labels, int64_t rows,
                                   int64_t V) {
  KernelScope clock(Kernel::softmax_loss, 4.0 * (2 * rows * V + rows));
#pragma omp parallel for schedule(dynamic, rows_per_piece(V)) if (rows * V > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) loss[r] = softmax_cross_entropy_row(logits + r * V, labels[r], V);
}

void softmax_cross_entropy_backward(float* probs, const int32_t* labels, int64_t rows, int64_t V, float scale) {
  KernelScope clock(Kernel::softmax_loss, 8.0 * rows * V);
#pragma omp parallel for schedule(dynamic, rows_per_piece(V)) if (rows * V > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) softmax_cross_entropy_grad_row(probs + r * V, labels[r], V, scale);
}

void softmax_cross_entropy_with_grad(float* logits, float* loss, const int32_t* labels, int64_t rows, int64_t V,
                                     float scale) {
  KernelScope clock(Kernel::softmax_loss, 4.0 * (2 * rows * V + rows));
#pragma omp parallel for schedule(dynamic, rows_per_piece(V)) if (rows * V > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    loss[r] = softmax_cross_entropy_row(logits + r * V, labels[r], V);
    softmax_cross_entropy_grad_row(logits + r * V, labels[r], V, scale);
  }
}

}  // namespace pf
