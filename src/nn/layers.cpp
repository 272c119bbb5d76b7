#include "nn/layers.hpp"

#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/kernel_clock.hpp"
#include "core/parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

namespace pf {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
constexpr int64_t kColBlock = 64;
}  // namespace

LayerNorm::LayerNorm(const std::string& prefix, int64_t C, float eps_)
    : weight(prefix + ".weight", Shape{C}, false), bias(prefix + ".bias", Shape{C}, false), eps(eps_) {}

void LayerNorm::forward(float* out, float* mean, float* rstd, const float* inp, int64_t N) const {
  layernorm_forward(out, mean, rstd, inp, weight.value.data(), bias.value.data(), N, weight.value.numel(), eps);
}

void LayerNorm::backward(float* dinp, const float* dout, const float* inp, const float* mean, const float* rstd,
                         int64_t N, bool accumulate) {
  layernorm_backward(dinp, weight.grad.data(), bias.grad.data(), dout, inp, weight.value.data(), mean, rstd, N,
                     weight.value.numel(), accumulate);
}

RmsNorm::RmsNorm(const std::string& prefix, int64_t C, float eps_) : weight(prefix + ".weight", Shape{C}, false), eps(eps_) {}

void RmsNorm::forward(float* out, float* rstd, const float* inp, int64_t N) const {
  rmsnorm_forward(out, rstd, inp, weight.value.data(), N, weight.value.numel(), eps);
}

void RmsNorm::backward(float* dinp, const float* dout, const float* inp, const float* rstd, int64_t N, bool accumulate) {
  rmsnorm_backward(dinp, weight.grad.data(), dout, inp, weight.value.data(), rstd, N, weight.value.numel(), accumulate);
}

Rope::Rope(int64_t head_size, int64_t positions_, double theta) : D(head_size), positions(positions_) {
  PF_CHECK(D % 2 == 0 && positions > 0, "rotary table for heads of {} over {} positions", D, positions);
  const int64_t half = D / 2;
  cos.resize(static_cast<size_t>(positions * half));
  sin.resize(cos.size());
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      cos[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(angle));
      sin[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(angle));
    }
}

void Rope::rotate(float* x, int64_t ld, int64_t heads, int64_t N, int64_t T, int64_t first, bool inverse) const {
  KernelScope clock(Kernel::elementwise, 8.0 * N * heads * D);
  const int64_t half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  PF_CHECK(N == 0 || first + std::min(N, T) <= positions, "rotary positions up to {} beyond the table's {}",
           first + std::min(N, T) - 1, positions);
#pragma omp parallel for schedule(dynamic, rows_per_piece(ld)) if (N * ld > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = first + n % T;
    const float *c = cos.data() + t * half, *s = sin.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* a = x + n * ld + h * D;
      float* b = a + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float u = a[i], w = b[i], si = sign * s[i];
        a[i] = u * c[i] - w * si;
        b[i] = w * c[i] + u * si;
      }
    }
  }
}

void embedding_forward(float* out, const int32_t* tokens, const int32_t* types, const float* wte,
                       const float* wpe, const float* wtt, int64_t N, int64_t T, int64_t C) {
  KernelScope clock(Kernel::embedding, 4.0 * N * C * (2 + (wpe != nullptr) + (wtt != nullptr)));
#pragma omp parallel for schedule(dynamic, rows_per_piece(C)) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* w = wte + static_cast<int64_t>(tokens[n]) * C;
    const float* p = wpe ? wpe + (n % T) * C : nullptr;
    float* o = out + n * C;
    if (!p) {
      std::copy(w, w + C, o);
    } else if (wtt) {
      const float* t = wtt + (types ? static_cast<int64_t>(types[n]) : 0) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = w[c] + p[c] + t[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = w[c] + p[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout, const int32_t* tokens,
                        const int32_t* types, int64_t N, int64_t T, int64_t C) {
  // The gradient read once, each table row touched read and written.
  KernelScope clock(Kernel::embedding, 4.0 * N * C * (1 + 2 * (1 + (dwpe != nullptr) + (dwtt != nullptr))));
  // Threads own column blocks and walk the tokens in order: scatter-adds never race.
  int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(dynamic, 1) if (N * C > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, w = std::min(kColBlock, C - c0);
    for (int64_t n = 0; n < N; ++n) {
      const float* d = dout + n * C + c0;
      float* gw = dwte + static_cast<int64_t>(tokens[n]) * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) gw[c] += d[c];
      if (dwpe) {
        float* gp = dwpe + (n % T) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) gp[c] += d[c];
      }
      if (dwtt) {
        float* gt = dwtt + (types ? static_cast<int64_t>(types[n]) : 0) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) gt[c] += d[c];
      }
    }
  }
}

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int64_t ld,
                       int64_t B, int64_t T, int64_t H, int64_t D, bool causal, const uint8_t* key_mask) {
  // per (b, h): P = softmax(Q K^T / sqrt(D) + mask) (T, T); out_h = P V (T, D)
  const int64_t C = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  BlasSingleThread one;  // many small products: parallel over (b, h) instead
  kernel_clock::add(Kernel::attention_products, 0, 4.0 * B * H * T * T * D);
  kernel_clock::add(Kernel::attention_softmax, 8.0 * B * H * T * T);
#pragma omp parallel for schedule(dynamic, 1) if (B * H * T * T * D > kParallelMin * 8)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const float* qb = q + b * T * ld + h * D;
    const float* kb = k + b * T * ld + h * D;
    const float* vb = v + b * T * ld + h * D;
    float* p = probs + bh * T * T;
    {
      KernelScope clock(Kernel::attention_products);
      gemm(false, true, T, T, D, scale, qb, ld, kb, ld, 0.0f, p, T);
    }
    {
      KernelScope clock(Kernel::attention_softmax);
      const uint8_t* km = key_mask ? key_mask + b * T : nullptr;
      for (int64_t i = 0; i < T; ++i) softmax_row(p + i * T, T, causal ? i + 1 : T, km);
    }
    KernelScope clock(Kernel::attention_products);
    gemm(false, false, T, D, T, 1.0f, p, T, vb, ld, 0.0f, out + b * T * C + h * D, C);
  }
}

void attention_decode(float* out, float* scores, const float* q, const float* k, const float* v, int64_t T, int64_t H,
                      int64_t D, int64_t kv_heads) {
  const int64_t C = H * D, ldkv = kv_heads * D, group = H / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kvh = h / group;
    gemm(false, true, 1, T, D, scale, q + h * D, C, k + kvh * D, ldkv, 0.0f, scores, T);
    softmax_row(scores, T, T);
    gemm(false, false, 1, D, T, 1.0f, scores, T, v + kvh * D, ldkv, 0.0f, out + h * D, C);
  }
}

int64_t attention_scratch_floats(int64_t T, int threads) { return T * T * threads; }

void attention_backward(float* dq, float* dk, float* dv, int64_t ldg, float* scratch, int64_t scratch_floats,
                        const float* dout, const float* probs, const float* q, const float* k, const float* v,
                        int64_t ld, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t C = H * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  PF_CHECK(attention_scratch_floats(T, omp_get_max_threads()) <= scratch_floats,
           "attention scratch for {} threads", omp_get_max_threads());
  BlasSingleThread one;
  kernel_clock::add(Kernel::attention_products, 0, 8.0 * B * H * T * T * D);
  kernel_clock::add(Kernel::attention_softmax, 12.0 * B * H * T * T);
#pragma omp parallel for schedule(dynamic, 1) if (B * H * T * T * D > kParallelMin * 8)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    int64_t off = b * T * ld + h * D, goff = b * T * ldg + h * D;
    const float* p = probs + bh * T * T;
    const float* dob = dout + b * T * C + h * D;
    float* dp = scratch + omp_get_thread_num() * T * T;
    {
      // dP = dO V^T; dV = P^T dO
      KernelScope clock(Kernel::attention_products);
      gemm(false, true, T, T, D, 1.0f, dob, C, v + off, ld, 0.0f, dp, T);
      gemm(true, false, T, D, T, 1.0f, p, T, dob, C, 0.0f, dv + goff, ldg);
    }
    // softmax backward: dS = P * (dP - rowsum(P * dP)), with the 1/sqrt(D) of the scores folded in
    KernelScope softmax_clock(Kernel::attention_softmax);
    for (int64_t i = 0; i < T; ++i) {
      const float* pr = p + i * T;
      float* dr = dp + i * T;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < T; ++j) s += pr[j] * dr[j];
#pragma omp simd
      for (int64_t j = 0; j < T; ++j) dr[j] = pr[j] * (dr[j] - s) * scale;
    }
    // dQ = dS K; dK = dS^T Q
    KernelScope clock(Kernel::attention_products);
    gemm(false, false, T, D, T, 1.0f, dp, T, k + off, ld, 0.0f, dq + goff, ldg);
    gemm(true, false, T, D, T, 1.0f, dp, T, q + off, ld, 0.0f, dk + goff, ldg);
  }
}

void dropout_forward(float* x, uint8_t* keep, int64_t n, float p, const CounterRng& rng) {
  KernelScope clock(Kernel::elementwise, 9.0 * n);
  const float s = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(dynamic, kPieceElements) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    keep[i] = rng.uniform(static_cast<uint64_t>(i)) >= p;
    x[i] = keep[i] ? x[i] * s : 0.0f;
  }
}

void dropout_backward(float* dx, const uint8_t* keep, int64_t n, float p) {
  KernelScope clock(Kernel::elementwise, 9.0 * n);
  const float s = 1.0f / (1.0f - p);
#pragma omp parallel for simd schedule(dynamic, kPieceElements) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = keep[i] ? dx[i] * s : 0.0f;
}

}  // namespace pf
