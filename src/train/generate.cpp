#include "train/generate.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pf {

int32_t sample_token(std::span<const float> logits, const SampleOptions& o, uint64_t draw) {
  PF_CHECK(!logits.empty(), "sampling from no logits");
  if (o.temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates: every id, or the top_k largest logits (ties broken by the lower id).
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < ids.size()) {
    std::partial_sort(ids.begin(), ids.begin() + o.top_k, ids.end(), higher);
    ids.resize(static_cast<size_t>(o.top_k));
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> w(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += w[i] = std::exp((logits[ids[i]] - top) / o.temperature);
  const double u = CounterRng{stream_key(o.seed, "generate")}.uniform(draw) * sum;
  double acc = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    if ((acc += w[i]) > u) return ids[i];
  return ids.back();  // u within rounding of the total
}

std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& o) {
  const ModelConfig& cfg = model.config();
  PF_CHECK(cfg.arch == Arch::Gpt, "generation needs a causal LM, not {}", cfg.arch);
  PF_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  const int window = cfg.seq_len;
  ModelState st = model.make_state(1, window);
  model.set_training(false);
  std::vector<int32_t> context(prompt.begin(), prompt.end()), out;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab));
  const size_t vocab = o.vocab > 0 ? std::min<size_t>(static_cast<size_t>(o.vocab), logits.size()) : logits.size();
  MicroBatch mb;
  for (int k = 0; k < o.max_new_tokens; ++k) {
    const int T = static_cast<int>(std::min<size_t>(context.size(), static_cast<size_t>(window)));
    mb.resize(1, T);
    std::copy(context.end() - T, context.end(), mb.tokens.begin());
    std::fill(mb.token_types.begin(), mb.token_types.end(), 0);
    std::fill(mb.attn_mask.begin(), mb.attn_mask.end(), 1);
    std::fill(mb.labels.begin(), mb.labels.end(), -1);
    model.logits(mb, st, 0, T - 1, logits.data());
    const int32_t next = sample_token(std::span<const float>(logits).first(vocab), o.sample, static_cast<uint64_t>(k));
    out.push_back(next);
    context.push_back(next);
    const bool go_on = !o.on_token || o.on_token(next);
    if (next == o.stop_token || !go_on) break;
  }
  model.set_training(true);
  return out;
}

}  // namespace pf
