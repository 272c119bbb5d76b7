// Config::validate and Config::check_files (config.hpp): each key's bounds (the key table,
// config_keys.hpp), what keys say about each other, and whether the files a run reads exist.
#include "config/config.hpp"

#include "config/config_keys.hpp"
#include "config/paths.hpp"
#include "config/placement.hpp"
#include "core/error.hpp"
#include "core/files.hpp"

#include <cmath>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

namespace pf {

namespace {

using namespace key_table;

template <typename T>
void require(bool ok, const char* key, fmt::format_string<T> msg, T v) {
  if (!ok) throw UsageError(std::string(key) + ": " + fmt::vformat(msg, fmt::make_format_args(v)));
}

// A key's bounds (kAny accepts anything); reals must be finite whatever their bounds.
template <typename T>
void check_bounds(const char* key, const T& v, const Bounds& b) {
  if constexpr (std::is_floating_point_v<T>) require(std::isfinite(v), key, "must be a finite number (got {})", v);
  if (!b.refusal) return;
  if constexpr (std::is_same_v<T, std::string>) {
    if (v.empty()) throw UsageError(std::string(key) + ": " + b.refusal);
  } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (b.auto_word && v == kAutoDataParallel) return;
    if (!b.accepts(static_cast<double>(v))) throw UsageError(std::string(key) + ": " + fmt::format(fmt::runtime(b.refusal), v));
  }
}

// The keys only a Llama-style model varies: grouped-query heads, rotary positions, an untied head.
void check_llama_keys(const ModelConfig& m) {
  const bool llama = m.arch == Arch::Llama;
  const int kv_heads = kv_heads_of(m);
  if (!llama && kv_heads != m.heads)
    usage_error("model.kv_heads", "{} differs from model.heads = {}: grouped-query attention is llama's (model.arch = {})",
                kv_heads, m.heads, m.arch);
  if (!llama && !m.tie_embeddings)
    usage_error("model.tie_embeddings", "false is llama's: {}'s LM head is its word embedding", m.arch);
  if (m.heads % kv_heads != 0)
    usage_error("model.kv_heads", "model.heads = {} is not divisible by {}", m.heads, kv_heads);
  if (llama && (m.hidden / m.heads) % 2 != 0)
    usage_error("model.heads", "rotary positions turn pairs of a head's dimensions: model.hidden / model.heads = {} "
                "must be even", m.hidden / m.heads);
}

// What no single key's bounds can say: the model's shape, the tokenizer, next-sentence pairs.
void check_model_relations(const Config& c) {
  const auto& m = c.model;
  if (m.hidden % m.heads != 0)
    usage_error("model.hidden", "{} is not divisible by model.heads = {}", m.hidden, m.heads);
  require(m.seq_len >= (m.arch == Arch::Bert ? 3 : 2), "model.seq_len",
          "must be at least 3 for bert ([CLS] x [SEP]) and 2 for a causal LM (got {})", m.seq_len);
  check_llama_keys(m);
  if (m.seq_len > m.max_position)
    usage_error("model.seq_len", "{} exceeds model.max_position = {}", m.seq_len, m.max_position);
  const int tok_vocab = c.data.vocab == Vocab::Bert ? 30522 : 50257;
  if (m.vocab < tok_vocab)
    usage_error("model.vocab", "{} is smaller than the {} tokenizer's vocabulary ({})", m.vocab, c.data.vocab,
                tok_vocab);
  if (c.data.nsp && m.arch != Arch::Bert)
    usage_error("data.nsp", "next-sentence prediction is BERT's (model.arch = {})", m.arch);
  if (c.data.nsp && m.seq_len < 5)
    usage_error("data.nsp", "a sentence pair needs model.seq_len >= 5 ([CLS] A [SEP] B [SEP]), got {}", m.seq_len);
}

// precond.placement = replay: one process following a recorded refresh pattern (K-FAC's: factors of one step each).
void check_replay(const Config& c) {
  const auto& k = c.kfac;
  // SOAP's work as units follows a SOAP bubbles run's record (optim/soap_record.hpp).
  const bool soap = places_soap_work(c);
  const bool replay = (k.enabled || soap) && placement_spec(k).replays;
  if (!k.refresh_record.empty() && !replay)
    usage_error("precond.refresh_record", "only applies with {} and precond.placement = replay",
                soap ? "optim.name = soap" : "kfac.enabled = true");
  if (!replay) return;
  if (k.refresh_record.empty())
    usage_error("precond.refresh_record", "precond.placement = replay follows a recorded refresh pattern: name the "
                "{} of a precond.placement = bubbles run", soap ? "soap_refresh.json" : "kfac_refresh.json");
  if (soap) return;  // SOAP's record is followed on any layout (train/soap_replay.hpp, runtime/soap/)
  const int W = c.parallel.data_parallel;  // auto: checked again once it is a number
  if (c.parallel.stages != 1 || (W != 1 && W != kAutoDataParallel))
    usage_error("kfac.placement", "'replay' is one process following a pipeline's record: parallel.stages = 1 and "
                "parallel.data_parallel = 1 (got {} and {})", c.parallel.stages, c.parallel.data_parallel);
  require(k.ema == 0, "kfac.ema", "must be 0 with kfac.placement = replay: the record names one step's factors (got {})",
          k.ema);
}

// The partition against the model, and K-FAC keys that only apply with others.
void check_run_relations(const Config& c) {
  if (c.optim.min_lr > c.optim.lr)
    usage_error("optim.min_lr", "must be at most optim.lr = {} (got {})", c.optim.lr, c.optim.min_lr);
  // SOAP preconditions the Linear weights itself: K-FAC's preconditioned gradient under it would
  // be two preconditioners stacked, which neither paper describes.
  if (c.optim.name == OptimName::Soap && c.kfac.enabled)
    usage_error("optim.name", "soap does not run with kfac.enabled = true: SOAP preconditions the Linear weights "
                "itself (set kfac.enabled = false, or another optim.name)");
  if (!c.parallel.partition.empty()) {
    int64_t sum = 0;
    for (int b : c.parallel.partition) {
      require(b >= 0, "parallel.partition", "entries must be >= 0 (got {})", b);
      sum += b;
    }
    if (sum != c.model.layers)
      usage_error("parallel.partition", "assigns {} transformer blocks but model.layers = {}", sum, c.model.layers);
  }
  const auto& k = c.kfac;
  const PlacementSpec spec = placement_spec(k);
  if (!k.plan_profile.empty() && !((k.enabled || places_soap_work(c)) && spec.planned))
    usage_error("kfac.plan_profile", "only applies with precond.placement = bubbles or adaptive (and kfac.enabled = "
                "true or optim.name = soap)");
  check_replay(c);
  // SOAP's planned refreshes keep it too (runtime/soap/soap_placement.hpp).
  if (k.min_refresh_steps != 1 && !((k.enabled || places_soap_work(c)) && spec.planned))
    usage_error("precond.min_refresh_steps", "only applies with precond.placement = bubbles or adaptive (and "
                "kfac.enabled = true or optim.name = soap)");
  if (k.max_refresh_steps > 0 && k.max_refresh_steps < k.min_refresh_steps)
    usage_error("kfac.max_refresh_steps", "must be 0 or at least kfac.min_refresh_steps = {} (got {})",
                k.min_refresh_steps, k.max_refresh_steps);
  if (k.max_refresh_steps > 0 && !(k.enabled && spec.fills_waits))
    usage_error("kfac.max_refresh_steps", "only applies with kfac.enabled = true and kfac.placement = adaptive");
  if (k.distributed != KfacStrategy::SpdKfac) {
    require(k.spd_pipelining, "kfac.spd_pipelining", "only applies with kfac.distributed = spd-kfac (got {})",
            k.distributed);
    require(k.spd_balance, "kfac.spd_balance", "only applies with kfac.distributed = spd-kfac (got {})", k.distributed);
  }
}

}  // namespace

void Config::validate() const {
  // Every real finite first (the TOML reader refuses inf and nan already; this covers a Config
  // built in code), then each key's bounds, then what keys say about each other.
  for_each_key(*this, [](const char* key, const auto& v, const Bounds&, const char*) { check_bounds(key, v, kAny); });
  for_each_key(*this, [](const char* key, const auto& v, const Bounds& b, const char*) { check_bounds(key, v, b); });
  check_model_relations(*this);
  check_run_relations(*this);
}

void resolve_data_parallel(Config& c, int world_size) {
  ParallelConfig& p = c.parallel;
  if (p.data_parallel != kAutoDataParallel) return;
  if (world_size % p.stages != 0)
    usage_error("parallel.stages", "the MPI world has {} rank{}, which {} stages do not divide (parallel.data_parallel = "
                "auto takes world size / stages: launch with scripts/pfrun -np {} or a multiple of it)", world_size,
                world_size == 1 ? "" : "s", p.stages, p.stages);
  p.data_parallel = world_size / p.stages;
  c.validate();
}

void Config::check_files() const {
  namespace fs = std::filesystem;
  // Only whether they exist: what else a token file must be (a regular file, its size, its ids) is
  // map_token_file's check (data/token_file.hpp), which names the key and the file.
  // A default token file names every place it was looked for.
  auto missing = [](const char* key, const std::string& path) {
    const std::vector<std::string> looked = data_candidates("corpus/" + fs::path(path).filename().string());
    if (looked.front() != path) usage_error(key, "no such file '{}' (scripts/prepare-data.sh makes it)", path);
    std::string where;
    for (const std::string& p : looked) where += (where.empty() ? "" : ", ") + p;
    usage_error(key, "no token file: looked for {} (scripts/prepare-data.sh makes them)", where);
  };
  if (!fs::exists(data.train_file)) missing("data.train_file", data.train_file);
  if (!fs::exists(data.valid_file)) missing("data.valid_file", data.valid_file);
  if (!kfac.refresh_record.empty())
    require_input_file(kfac.refresh_record, "precond.refresh_record",
                       "a pipeline run writes out_dir/kfac_refresh.json (K-FAC) or out_dir/soap_refresh.json (SOAP)");
  if (!kfac.plan_profile.empty())
    require_input_file(kfac.plan_profile, "kfac.plan_profile",
                       "a bubbles run writes out_dir/kfac_profile.json (K-FAC) or out_dir/soap_profile.json (SOAP)");
}

}  // namespace pf
