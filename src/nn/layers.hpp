#pragma once
// The layers that are not Linear, each a forward/backward pair of plain functions (llm.c style) or
// a small struct holding its parameters. Shapes use N = rows * seq tokens, C = hidden, H heads of
// size D = C / H. Backward functions accumulate (+=) into parameter gradients.
#include "core/kernels.hpp"
#include "core/rng.hpp"
#include "nn/param.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace pf {

// --- LayerNorm with its weight and bias ([C] each) ---
struct LayerNorm {
  Param weight, bias;
  float eps;
  LayerNorm(const std::string& prefix, int64_t C, float eps_);
  // inp, out are (N, C); mean, rstd (N) are kept for the backward
  void forward(float* out, float* mean, float* rstd, const float* inp, int64_t N) const;
  // dout, inp (N, C) -> dinp (N, C) (= or += when accumulate); dweight, dbias += (C)
  void backward(float* dinp, const float* dout, const float* inp, const float* mean, const float* rstd,
                int64_t N, bool accumulate);
};

// --- RMSNorm with its weight ([C]; Llama's, no bias) ---
struct RmsNorm {
  Param weight;
  float eps;
  RmsNorm(const std::string& prefix, int64_t C, float eps_);
  // inp, out are (N, C); rstd (N) is kept for the backward
  void forward(float* out, float* rstd, const float* inp, int64_t N) const;
  // dout, inp (N, C) -> dinp (N, C) (= or += when accumulate); dweight += (C)
  void backward(float* dinp, const float* dout, const float* inp, const float* rstd, int64_t N, bool accumulate);
};

// --- Rotary position embedding (Llama; Hugging Face's pairing: dimension i of a head with i + D/2) ---
// The pair of a head at position t turns by the angle t * theta^(-2i/D). cos and sin are a table
// of (positions, D/2), computed in double once.
struct Rope {
  int64_t D = 0, positions = 0;
  std::vector<float> cos, sin;
  Rope() = default;
  Rope(int64_t head_size, int64_t positions, double theta);
  // x: N rows at stride ld, each `heads` heads of D, rotated in place; row n is at position
  // first + n mod T. inverse: turn back by the same angles (the backward: R^T = R(-angle)).
  void rotate(float* x, int64_t ld, int64_t heads, int64_t N, int64_t T, int64_t first, bool inverse) const;
};

// --- Embedding: word + position (+ BERT token type) ---
// tokens, types (N; types may be null = all 0) with position t = n mod T; wte (V, C), wpe (P, C) or
// null (Llama: positions are rotary), wtt (types, C) or null; out (N, C) = wte[token] + wpe[t] + wtt[type]
void embedding_forward(float* out, const int32_t* tokens, const int32_t* types, const float* wte,
                       const float* wpe, const float* wtt, int64_t N, int64_t T, int64_t C);
// dout (N, C): dwte[token] += dout, dwpe[t] += dout, dwtt[type] += dout (null tables skipped; per column in token
// order, so the same bits for any thread count)
void embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout, const int32_t* tokens,
                        const int32_t* types, int64_t N, int64_t T, int64_t C);

// --- Multi-head self-attention (the part between the q/k/v and output projections) ---
// q, k, v are (B, T, ld) with head h in columns [h*D, (h+1)*D) (ld = C for separate buffers,
// 3C for GPT-2's fused qkv); out is (B, T, C); probs (B, H, T, T) keeps the softmax for the
// backward. causal: token i sees keys j <= i (GPT). key_mask (B*T, 1 = real token) or null:
// padding keys get probability 0 (BERT).
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, int64_t ld,
                       int64_t B, int64_t T, int64_t H, int64_t D, bool causal, const uint8_t* key_mask);
// One new token's attention over the T keys and values so far (a KV cache, generate): q (C), k and v
// (T, kv_heads x D) with key/value head j in columns [j*D, (j+1)*D), shared by query heads
// j*H/kv_heads .. (j+1)*H/kv_heads - 1 (kv_heads = H: every head its own), out (C); `scores` holds
// T floats. The same arithmetic as attention_forward's row of the last token, in a row product.
void attention_decode(float* out, float* scores, const float* q, const float* k, const float* v, int64_t T, int64_t H,
                      int64_t D, int64_t kv_heads);
// Scratch the backward needs: one (T, T) matrix per thread.
int64_t attention_scratch_floats(int64_t T, int threads);
// dout (B, T, C) -> dq, dk, dv (B, T, ldg) written (not accumulated) in the same head layout.
void attention_backward(float* dq, float* dk, float* dv, int64_t ldg, float* scratch, int64_t scratch_floats,
                        const float* dout, const float* probs, const float* q, const float* k, const float* v,
                        int64_t ld, int64_t B, int64_t T, int64_t H, int64_t D);

// --- Dropout (inverted: kept values scaled by 1/(1-p)), in place ---
// keep (n) records the mask for the backward; element i's draw is rng.uniform(i).
void dropout_forward(float* x, uint8_t* keep, int64_t n, float p, const CounterRng& rng);
void dropout_backward(float* dx, const uint8_t* keep, int64_t n, float p);

}  // namespace pf
