#include "train/generate.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace pf {

namespace {
// Nucleus sampling: the candidates, most likely first, cut after the first whose cumulative
// probability reaches top_p; returns the kept weights' sum.
template <typename Higher>
double keep_nucleus(std::vector<int32_t>& ids, std::vector<double>& w, double sum, double top_p, Higher higher) {
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return higher(ids[a], ids[b]); });
  std::vector<int32_t> kept_ids;
  std::vector<double> kept_w;
  double acc = 0;
  for (size_t i : order) {
    kept_ids.push_back(ids[i]), kept_w.push_back(w[i]);
    if ((acc += w[i]) >= top_p * sum) break;
  }
  ids = std::move(kept_ids), w = std::move(kept_w);
  return acc;
}
}  // namespace

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
  if (o.top_p < 1) sum = keep_nucleus(ids, w, sum, o.top_p, higher);
  const double u = CounterRng{stream_key(o.seed, "generate")}.uniform(draw) * sum;
  double acc = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    if ((acc += w[i]) > u) return ids[i];
  return ids.back();  // u within rounding of the total
}

namespace {
// The logits of the next token after `context` (its last model.seq_len tokens): through the KV
// cache while the context fits the window, else the window recomputed in full.
class NextLogits {
 public:
  NextLogits(Model& model, bool kv_cache) : model_(model), window_(model.config().seq_len) {
    if (kv_cache) cache_ = model.make_kv_cache(window_);
  }

  void operator()(const std::vector<int32_t>& context, float* out) {
    if (cache_.capacity() > 0 && context.size() <= static_cast<size_t>(window_)) {
      for (size_t t = static_cast<size_t>(cache_.length); t < context.size(); ++t) model_.decode(context[t], cache_, out);
      return;
    }
    const int T = static_cast<int>(std::min<size_t>(context.size(), static_cast<size_t>(window_)));
    if (!st_) st_ = model_.make_state(1, window_);  // a window's activations (and logits): made when needed
    mb_.resize(1, T);
    std::copy(context.end() - T, context.end(), mb_.tokens.begin());
    std::fill(mb_.token_types.begin(), mb_.token_types.end(), 0);
    std::fill(mb_.attn_mask.begin(), mb_.attn_mask.end(), 1);
    std::fill(mb_.labels.begin(), mb_.labels.end(), -1);
    model_.logits(mb_, *st_, 0, T - 1, out);
  }

 private:
  Model& model_;
  int window_;
  std::optional<ModelState> st_;
  KvCache cache_;
  MicroBatch mb_;
};
}  // namespace

std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const GenerateOptions& o) {
  const ModelConfig& cfg = model.config();
  PF_CHECK(causal_lm(cfg.arch), "generation needs a causal LM, not {}", cfg.arch);
  PF_CHECK(!prompt.empty(), "generation needs at least one prompt token");
  model.set_training(false);
  NextLogits next_logits(model, o.kv_cache);
  std::vector<int32_t> context(prompt.begin(), prompt.end()), out;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab));
  const size_t vocab = o.vocab > 0 ? std::min<size_t>(static_cast<size_t>(o.vocab), logits.size()) : logits.size();
  for (int k = 0; k < o.max_new_tokens; ++k) {
    next_logits(context, logits.data());
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
