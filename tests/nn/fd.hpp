#pragma once
// Helpers for the gradient tests: central finite differences, in double, of the float layers.
#include "config/config.hpp"
#include "core/micro_batch.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace pf::test {

inline void fill_normal(float* v, int64_t n, uint64_t seed, float scale = 1.0f) {
  CounterRng r{stream_key(seed, "fill")};
  for (int64_t i = 0; i < n; ++i) v[i] = scale * r.normal(i);
}
inline Tensor randn(Shape s, uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(s));
  fill_normal(t.data(), t.numel(), seed, scale);
  return t;
}
// sum_i a[i] * b[i] in double: the scalar "loss" of a layer output projected on a fixed random R.
inline double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

struct Tol {
  float eps = 1e-2f;    // perturbation (applied in float; the actual step is used)
  double rtol = 1e-2;   // relative to the analytic entry
  double atol = 5e-3;   // relative to the largest analytic entry of the tensor
  double floor = 1e-4;  // absolute floor (float noise of the loss / (2 eps))
  int samples = 24;     // entries checked per tensor (spread over it)
};

// Checks grad[i] against (loss(v[i] + eps) - loss(v[i] - eps)) / (2 eps) for a spread of entries
// of `value`. `loss` re-runs the float forward and returns a double.
template <class Loss>
void check_grad(const std::string& what, float* value, const float* grad, int64_t n, Loss&& loss, Tol tol = {}) {
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, double(std::abs(grad[i])));
  int64_t step = std::max<int64_t>(1, n / tol.samples);
  int bad = 0;
  for (int64_t i = (n > tol.samples ? step / 2 : 0); i < n; i += step) {
    float old = value[i];
    value[i] = old + tol.eps;
    float up = value[i];
    double fp = loss();
    value[i] = old - tol.eps;
    float down = value[i];
    double fm = loss();
    value[i] = old;
    double fd = (fp - fm) / (double(up) - double(down));
    double lim = tol.rtol * std::abs(grad[i]) + std::max(tol.atol * scale, tol.floor);
    if (std::abs(fd - grad[i]) > lim && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << " vs finite difference " << fd
                    << " (limit " << lim << ", max |grad| " << scale << ")";
  }
}

// Hugging Face's name of the tied word matrix.
inline std::string word_name(Arch a) {
  return a == Arch::Bert ? "bert.embeddings.word_embeddings.weight"
         : a == Arch::Gpt ? "transformer.wte.weight"
                          : "model.embed_tokens.weight";
}

inline ModelConfig tiny_config(const std::string& arch) {
  ModelConfig c;
  c.arch = parse_name<Arch>(arch).value();
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.ffn = 32;
  c.seq_len = 8;
  c.max_position = 16;
  c.vocab = 50;
  c.type_vocab = 2;
  c.layer_norm_eps = 1e-5f;
  c.init_std = 0.2f;  // larger than 0.02 so every path carries a gradient well above float noise
  // llama: grouped-query attention (two query heads per key/value head), the path bert and gpt
  // do not have. Tied like them (tests of the untied head set model.tie_embeddings = false).
  if (c.arch == Arch::Llama) c.kv_heads = 1;
  return c;
}

// Two sequences of 8 tokens; BERT: padding at the end of the second, ~1/3 labelled (never
// padding); GPT: every position labelled.
inline MicroBatch tiny_batch(const ModelConfig& c, int index = 0, uint64_t seed = 1) {
  MicroBatch mb;
  mb.index = index;
  mb.resize(2, c.seq_len);
  CounterRng r{stream_key(seed, "batch")};
  const int n = 2 * c.seq_len;
  for (int i = 0; i < n; ++i) {
    mb.tokens[i] = int32_t(r.bits(4 * i) % c.vocab);
    mb.token_types[i] = c.arch == Arch::Bert ? (i % c.seq_len >= c.seq_len / 2) : 0;
    mb.attn_mask[i] = !(c.arch == Arch::Bert && i >= n - 2);
    bool labelled = causal_lm(c.arch) || (mb.attn_mask[i] && (r.bits(4 * i + 1) % 3 == 0 || i == 0));
    mb.labels[i] = labelled ? int32_t(r.bits(4 * i + 2) % c.vocab) : -1;
  }
  return mb;
}

}  // namespace pf::test
