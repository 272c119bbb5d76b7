#pragma once
// Text generation with a causal LM (model.arch = gpt): one token at a time, each from the logits
// at the last position of the context (the last model.seq_len tokens, the length it was trained
// on). While the context fits that window a KV cache keeps every block's keys and values, so a new
// token costs one token's work plus its attention over the cache; past it, the window slides and
// is recomputed in full each token (positions are absolute: a slid window's keys all change).
//
// Sampling: temperature 0 is greedy (the argmax, the lowest id on a tie); otherwise the logits are
// divided by the temperature, all but the top_k largest dropped (top_k = 0 keeps all), then all but
// the most likely tokens whose probabilities first reach top_p (nucleus sampling, Hugging Face's
// TopPLogitsWarper; 1 keeps all, the most likely token always stays), and a token drawn from the
// softmax of the rest with the uniform number `draw` of the stream (seed, "generate"), so a seed
// gives the same text for any thread count.
#include "nn/model.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace pf {

struct SampleOptions {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;  // in (0, 1]
  uint64_t seed = 0;
};

// The token chosen from one row of logits for the draw-th sampled token.
int32_t sample_token(std::span<const float> logits, const SampleOptions& o, uint64_t draw);

struct GenerateOptions {
  int max_new_tokens = 32;
  SampleOptions sample;
  int32_t stop_token = -1;  // generation ends after this token (GPT-2: <|endoftext|>); -1 = none
  int vocab = 0;            // only ids below this are drawn (the tokenizer's size); 0 = model.vocab
  bool kv_cache = true;     // false: every token's window recomputed in full (the reference)
  // Called with each new token as it is drawn (streaming); false stops the generation there.
  std::function<bool(int32_t)> on_token;
};

// The new tokens after `prompt` (which must not be empty). `model` is the whole model, with its
// weights loaded.
std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& o);

}  // namespace pf
