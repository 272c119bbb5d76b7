#include "config/config.hpp"

#include "core/error.hpp"
#include "core/suggest.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace pf {

namespace {

struct Preset {
  const char* name;
  const char* arch;
  int layers, hidden, heads, ffn, vocab, max_position;
};
constexpr Preset kPresets[] = {
    {"bert-tiny", "bert", 2, 128, 2, 512, 30522, 512},
    {"bert-mini", "bert", 4, 256, 4, 1024, 30522, 512},
    {"bert-small", "bert", 4, 512, 8, 2048, 30522, 512},
    {"bert-medium", "bert", 8, 512, 8, 2048, 30522, 512},
    {"bert-base", "bert", 12, 768, 12, 3072, 30522, 512},
    {"bert-large", "bert", 24, 1024, 16, 4096, 30522, 512},
    {"gpt2-tiny", "gpt", 2, 128, 2, 512, 50257, 1024},
    {"gpt2-mini", "gpt", 4, 256, 4, 1024, 50257, 1024},
    {"gpt2-small", "gpt", 12, 768, 12, 3072, 50257, 1024},
    {"gpt2-medium", "gpt", 24, 1024, 16, 4096, 50257, 1024},
};

// Text a TOML file can hold and config.toml can print back: valid UTF-8 (no overlong forms or
// surrogates), no NUL (a path would end there).
bool printable_text(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (n < 0 || i + n >= s.size()) return false;
    uint32_t cp = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

// Reads typed values by dotted key and remembers which keys exist, so that anything left in the
// file afterwards is an unknown key.
class Reader {
 public:
  explicit Reader(const toml::table& t) : root_(t) {}

  template <typename T>
  void get(const std::string& key, T& out) {
    known_.insert(key);
    toml::node_view<const toml::node> n = root_.at_path(key);
    if (!n) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!n.is_boolean()) usage_error(key, "expected true or false");
      out = *n.value<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!n.is_integer()) usage_error(key, "expected an integer");
      int64_t v = *n.value<int64_t>();
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
        usage_error(key, "{} is out of range", v);
      out = static_cast<T>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n.is_number()) usage_error(key, "expected a number");
      const double v = *n.value<double>();
      // inf and nan are TOML numbers; so is 1e39, which a float key turns into inf.
      if (!std::isfinite(v) || std::abs(v) > static_cast<double>(std::numeric_limits<T>::max()))
        usage_error(key, "must be a finite number{} (got {})",
                    sizeof(T) < sizeof(double) ? " within single precision (|x| < 3.4e38)" : "", v);
      out = static_cast<T>(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!n.is_string()) usage_error(key, "expected a string");
      out = *n.value<std::string>();
      if (!printable_text(out)) usage_error(key, "must be UTF-8 text without NUL characters");
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      const toml::array* a = n.as_array();
      if (!a) usage_error(key, "expected an array of integers");
      out.clear();
      for (const toml::node& e : *a) {
        if (!e.is_integer()) usage_error(key, "expected an array of integers");
        const int64_t v = *e.value<int64_t>();
        if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
          usage_error(key, "{} is out of range", v);
        out.push_back(static_cast<int>(v));
      }
    }
  }

  bool has(const std::string& key) const { return static_cast<bool>(root_.at_path(key)); }

  void refuse_unknown() const { walk(root_, ""); }

 private:
  void walk(const toml::table& t, const std::string& prefix) const {
    for (auto&& [k, v] : t) {
      std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (const toml::table* sub = v.as_table()) {
        if (prefix.empty() && kTables.count(key)) {
          walk(*sub, key);
          continue;
        }
        if (prefix.empty()) {
          const std::string near = closest_match(key, kTables);
          if (!near.empty()) usage_error(key, "unknown configuration table (did you mean [{}]?)", near);
        }
      }
      if (known_.count(key)) continue;
      const std::string near = closest_match(key, known_);
      if (near.empty()) usage_error(key, "unknown configuration key");
      usage_error(key, "unknown configuration key (did you mean {}?)", near);
    }
  }
  static inline const std::set<std::string> kTables = {"model", "data", "optim", "train", "parallel", "kfac"};
  const toml::table& root_;
  std::set<std::string> known_;
};

// Applies one `key=value` override; the value is parsed as TOML (so 4, 1e-3, true, "x", [1,2]
// work) and otherwise taken as a bare string.
void apply_override(toml::table& root, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) usage_error("--set " + kv, "expected key=value");
  std::string key = kv.substr(0, eq), text = kv.substr(eq + 1);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", text}};
  }
  const toml::node* v = parsed.get("v");
  toml::table* t = &root;
  std::string rest = key;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos;) {
    std::string part = rest.substr(0, dot);
    rest = rest.substr(dot + 1);
    toml::node* child = t->get(part);
    if (!child) child = t->insert_or_assign(part, toml::table{}).first->second.as_table();
    if (!child->is_table()) usage_error(key, "is not a table");
    t = child->as_table();
  }
  if (v->is_integer()) t->insert_or_assign(rest, *v->value<int64_t>());
  else if (v->is_floating_point()) t->insert_or_assign(rest, *v->value<double>());
  else if (v->is_boolean()) t->insert_or_assign(rest, *v->value<bool>());
  else if (v->is_array()) t->insert_or_assign(rest, *v->as_array());
  else if (v->is_string()) t->insert_or_assign(rest, *v->value<std::string>());
  else usage_error(key, "unsupported value '{}'", text);
}

Config from_table(toml::table& root, const std::vector<std::string>& overrides) {
  for (const auto& kv : overrides) apply_override(root, kv);
  Config c;
  Reader r(root);
  r.get("model.preset", c.model.preset);
  if (!c.model.preset.empty()) apply_model_preset(c.model, c.model.preset);
  auto& m = c.model;
  r.get("model.arch", m.arch);
  if (m.preset.empty() && m.arch == "gpt") {
    // An architecture without a preset takes its own vocabulary and table sizes.
    m.layer_norm_eps = 1e-5f;
    m.vocab = 50257;
    m.max_position = 1024;
  }
  r.get("model.layers", m.layers);
  r.get("model.hidden", m.hidden);
  r.get("model.heads", m.heads);
  r.get("model.ffn", m.ffn);
  r.get("model.seq_len", m.seq_len);
  r.get("model.max_position", m.max_position);
  r.get("model.vocab", m.vocab);
  r.get("model.type_vocab", m.type_vocab);
  r.get("model.dropout", m.dropout);
  r.get("model.layer_norm_eps", m.layer_norm_eps);
  r.get("model.init_std", m.init_std);
  r.get("model.gelu", m.gelu);
  if (m.gelu.empty()) m.gelu = m.arch == "gpt" ? "tanh" : "erf";

  auto& d = c.data;
  d.vocab = m.arch == "gpt" ? "gpt2" : "bert";
  r.get("data.vocab", d.vocab);
  r.get("data.train_file", d.train_file);
  r.get("data.valid_file", d.valid_file);
  if (d.train_file.empty()) d.train_file = "data/corpus/train." + d.vocab + ".bin";
  if (d.valid_file.empty()) d.valid_file = "data/corpus/valid." + d.vocab + ".bin";
  r.get("data.shuffle", d.shuffle);
  r.get("data.mask_prob", d.mask_prob);
  r.get("data.nsp", d.nsp);
  m.nsp = d.nsp;
  r.get("data.seed", d.seed);

  auto& o = c.optim;
  r.get("optim.name", o.name);
  r.get("optim.lr", o.lr);
  r.get("optim.warmup_steps", o.warmup_steps);
  r.get("optim.decay_power", o.decay_power);
  r.get("optim.decay_steps", o.decay_steps);
  r.get("optim.weight_decay", o.weight_decay);
  r.get("optim.beta1", o.beta1);
  r.get("optim.beta2", o.beta2);
  r.get("optim.eps", o.eps);
  r.get("optim.momentum", o.momentum);
  r.get("optim.grad_clip", o.grad_clip);

  auto& t = c.train;
  r.get("train.steps", t.steps);
  r.get("train.seed", t.seed);
  r.get("train.threads", t.threads);
  r.get("train.deterministic", t.deterministic);
  r.get("train.log_every", t.log_every);
  r.get("train.eval_every", t.eval_every);
  r.get("train.eval_batches", t.eval_batches);
  r.get("train.out_dir", t.out_dir);
  r.get("train.log_json", t.log_json);
  r.get("train.checkpoint_dir", t.checkpoint_dir);
  r.get("train.checkpoint_every", t.checkpoint_every);
  r.get("train.keep_checkpoints", t.keep_checkpoints);
  r.get("train.on_nonfinite", t.on_nonfinite);

  auto& p = c.parallel;
  r.get("parallel.stages", p.stages);
  r.get("parallel.data_parallel", p.data_parallel);
  r.get("parallel.schedule", p.schedule);
  r.get("parallel.schedule_file", p.schedule_file);
  r.get("parallel.micro_batches", p.micro_batches);
  r.get("parallel.micro_batch_size", p.micro_batch_size);
  r.get("parallel.virtual_stages", p.virtual_stages);
  r.get("parallel.partition", p.partition);
  r.get("parallel.recompute", p.recompute);
  r.get("parallel.backward_forward_ratio", p.backward_forward_ratio);

  auto& k = c.kfac;
  r.get("kfac.enabled", k.enabled);
  r.get("kfac.damping", k.damping);
  r.get("kfac.ema", k.ema);
  r.get("kfac.kl_clip", k.kl_clip);
  r.get("kfac.inverse_every", k.inverse_every);
  r.get("kfac.diag_limit", k.diag_limit);
  // One stage has no bubbles: there K-FAC's default placement is inline (a pipeline's is
  // PipeFisher's bubbles). Without K-FAC the key keeps its default, so that config.toml does not
  // change with the layout.
  if (!r.has("kfac.placement") && p.stages == 1 && k.enabled) k.placement = "inline";
  r.get("kfac.placement", k.placement);
  r.get("kfac.distributed", k.distributed);
  r.get("kfac.spd_pipelining", k.spd_pipelining);
  r.get("kfac.spd_balance", k.spd_balance);
  r.get("kfac.warmup_steps", k.warmup_steps);
  r.get("kfac.replan_on_drift", k.replan_on_drift);
  r.get("kfac.split_inversions", k.split_inversions);
  r.get("kfac.plan_profile", k.plan_profile);

  r.refuse_unknown();
  c.validate();
  return c;
}

template <typename T>
void require(bool ok, const char* key, fmt::format_string<T> msg, T v) {
  if (!ok) throw UsageError(std::string(key) + ": " + fmt::vformat(msg, fmt::make_format_args(v)));
}

void one_of(const std::string& v, std::initializer_list<const char*> allowed, const char* key) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  usage_error(key, "'{}' is not one of {}", v, list);
}

}  // namespace

void apply_model_preset(ModelConfig& m, const std::string& preset) {
  for (const Preset& p : kPresets) {
    if (preset != p.name) continue;
    m.preset = p.name;
    m.arch = p.arch;
    m.layers = p.layers;
    m.hidden = p.hidden;
    m.heads = p.heads;
    m.ffn = p.ffn;
    m.vocab = p.vocab;
    m.max_position = p.max_position;
    m.layer_norm_eps = m.arch == "gpt" ? 1e-5f : 1e-12f;
    return;
  }
  std::string names;
  for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  usage_error("model.preset", "unknown preset '{}' (known: {})", preset, names);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

Config Config::from_toml_string(const std::string& text, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error& e) {
    usage_error("config", "line {}: {}", e.source().begin.line, std::string(e.description()));
  }
  return from_table(root, overrides);
}

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return from_toml_string("", overrides);
  // A directory opens as an empty stream (which would train with the defaults).
  if (std::filesystem::is_directory(path)) usage_error("--config", "'{}' is a directory, not a TOML file", path);
  std::ifstream in(path);
  if (!in) usage_error("--config", "cannot open configuration file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    usage_error(path, "line {}: {}", e.source().begin.line, std::string(e.description()));
  }
  return from_table(root, overrides);
}

void Config::validate() const {
  // Every real-valued key finite (the TOML reader refuses inf and nan already; this covers a
  // Config built in code).
  const std::pair<const char*, double> reals[] = {
      {"model.dropout", model.dropout}, {"model.layer_norm_eps", model.layer_norm_eps},
      {"model.init_std", model.init_std}, {"data.mask_prob", data.mask_prob}, {"optim.lr", optim.lr},
      {"optim.decay_power", optim.decay_power}, {"optim.weight_decay", optim.weight_decay},
      {"optim.beta1", optim.beta1}, {"optim.beta2", optim.beta2}, {"optim.eps", optim.eps},
      {"optim.momentum", optim.momentum}, {"optim.grad_clip", optim.grad_clip}, {"kfac.damping", kfac.damping},
      {"kfac.ema", kfac.ema}, {"kfac.kl_clip", kfac.kl_clip},
      {"parallel.backward_forward_ratio", parallel.backward_forward_ratio}};
  for (auto [key, v] : reals) require(std::isfinite(v), key, "must be a finite number (got {})", v);
  const auto& m = model;
  one_of(m.arch, {"bert", "gpt"}, "model.arch");
  require(m.layers > 0, "model.layers", "must be positive (got {})", m.layers);
  require(m.hidden > 0, "model.hidden", "must be positive (got {})", m.hidden);
  require(m.heads > 0, "model.heads", "must be positive (got {})", m.heads);
  require(m.ffn > 0, "model.ffn", "must be positive (got {})", m.ffn);
  require(m.vocab > 0, "model.vocab", "must be positive (got {})", m.vocab);
  require(m.max_position > 0, "model.max_position", "must be positive (got {})", m.max_position);
  require(m.type_vocab > 0, "model.type_vocab", "must be positive (got {})", m.type_vocab);
  if (m.hidden % m.heads != 0)
    usage_error("model.hidden", "{} is not divisible by model.heads = {}", m.hidden, m.heads);
  require(m.seq_len >= (m.arch == "bert" ? 3 : 2), "model.seq_len",
          "must be at least 3 for bert ([CLS] x [SEP]) and 2 for gpt (got {})", m.seq_len);
  if (m.seq_len > m.max_position)
    usage_error("model.seq_len", "{} exceeds model.max_position = {}", m.seq_len, m.max_position);
  require(m.dropout >= 0 && m.dropout < 1, "model.dropout", "must be in [0, 1) (got {})", m.dropout);
  require(m.layer_norm_eps > 0, "model.layer_norm_eps", "must be positive (got {})", m.layer_norm_eps);
  require(m.init_std > 0, "model.init_std", "must be positive (got {})", m.init_std);
  one_of(m.gelu, {"erf", "tanh"}, "model.gelu");

  one_of(data.vocab, {"bert", "gpt2"}, "data.vocab");
  int tok_vocab = data.vocab == "bert" ? 30522 : 50257;
  if (m.vocab < tok_vocab)
    usage_error("model.vocab", "{} is smaller than the {} tokenizer's vocabulary ({})", m.vocab, data.vocab,
                tok_vocab);
  require(data.mask_prob > 0 && data.mask_prob < 1, "data.mask_prob", "must be in (0, 1) (got {})",
          data.mask_prob);
  if (data.nsp && m.arch != "bert") usage_error("data.nsp", "next-sentence prediction is BERT's (model.arch = {})", m.arch);
  if (data.nsp && m.seq_len < 5)
    usage_error("data.nsp", "a sentence pair needs model.seq_len >= 5 ([CLS] A [SEP] B [SEP]), got {}", m.seq_len);

  one_of(optim.name, {"nvlamb", "adamw", "sgd"}, "optim.name");
  require(optim.lr > 0, "optim.lr", "must be positive (got {})", optim.lr);
  require(optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 (got {})", optim.warmup_steps);
  require(optim.decay_power >= 0, "optim.decay_power", "must be >= 0 (got {})", optim.decay_power);
  require(optim.decay_steps >= 0, "optim.decay_steps", "must be >= 0 (got {})", optim.decay_steps);
  require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0 (got {})", optim.weight_decay);
  require(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", "must be in [0, 1) (got {})", optim.beta1);
  require(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", "must be in [0, 1) (got {})", optim.beta2);
  require(optim.eps > 0, "optim.eps", "must be positive (got {})", optim.eps);
  require(optim.momentum >= 0 && optim.momentum < 1, "optim.momentum", "must be in [0, 1) (got {})",
          optim.momentum);
  require(optim.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (got {})", optim.grad_clip);

  require(train.steps > 0, "train.steps", "must be positive (got {})", train.steps);
  require(train.threads >= 0, "train.threads", "must be >= 0 (got {})", train.threads);
  require(train.log_every > 0, "train.log_every", "must be positive (got {})", train.log_every);
  require(train.eval_every >= 0, "train.eval_every", "must be >= 0 (got {})", train.eval_every);
  require(train.eval_batches > 0, "train.eval_batches", "must be positive (got {})", train.eval_batches);
  require(!train.out_dir.empty(), "train.out_dir", "must not be empty{}", std::string());
  require(train.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0 (got {})",
          train.checkpoint_every);
  require(train.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1 (got {})", train.keep_checkpoints);
  require(train.on_nonfinite == "skip" || train.on_nonfinite == "stop", "train.on_nonfinite",
          "must be 'skip' or 'stop' (got '{}')", train.on_nonfinite);

  const auto& p = parallel;
  require(p.stages > 0, "parallel.stages", "must be positive (got {})", p.stages);
  require(p.data_parallel > 0, "parallel.data_parallel", "must be positive (got {})", p.data_parallel);
  require(p.micro_batches > 0, "parallel.micro_batches", "must be positive (got {})", p.micro_batches);
  require(p.micro_batch_size > 0, "parallel.micro_batch_size", "must be positive (got {})",
          p.micro_batch_size);
  require(p.virtual_stages > 0, "parallel.virtual_stages", "must be positive (got {})", p.virtual_stages);
  // Beyond 1e3 (or below 1e-3) one of the two is free next to the other; the order is then settled.
  require(p.backward_forward_ratio >= 1e-3 && p.backward_forward_ratio <= 1e3, "parallel.backward_forward_ratio",
          "must be between 0.001 and 1000 (got {})", p.backward_forward_ratio);
  one_of(p.schedule, {"naive", "gpipe", "1f1b", "interleaved", "chimera", "zb-h1"}, "parallel.schedule");
  if (!p.partition.empty()) {
    int64_t sum = 0;
    for (int b : p.partition) {
      require(b >= 0, "parallel.partition", "entries must be >= 0 (got {})", b);
      sum += b;
    }
    if (sum != m.layers)
      usage_error("parallel.partition", "assigns {} transformer blocks but model.layers = {}", sum, m.layers);
  }

  require(kfac.warmup_steps >= -1, "kfac.warmup_steps", "must be >= 0, or -1 for optim.warmup_steps (got {})",
          kfac.warmup_steps);
  require(kfac.damping > 0, "kfac.damping", "must be positive (got {})", kfac.damping);
  require(kfac.ema >= 0 && kfac.ema < 1, "kfac.ema", "must be in [0, 1) (got {})", kfac.ema);
  require(kfac.kl_clip >= 0, "kfac.kl_clip", "must be >= 0 (got {})", kfac.kl_clip);
  require(kfac.inverse_every > 0, "kfac.inverse_every", "must be positive (got {})", kfac.inverse_every);
  require(kfac.diag_limit > 0, "kfac.diag_limit", "must be positive (got {})", kfac.diag_limit);
  one_of(kfac.placement, {"bubbles", "inline", "skip"}, "kfac.placement");
  one_of(kfac.distributed, {"d-kfac", "mpd-kfac", "spd-kfac"}, "kfac.distributed");
  if (!kfac.plan_profile.empty() && !(kfac.enabled && kfac.placement == "bubbles"))
    usage_error("kfac.plan_profile", "only applies with kfac.enabled = true and kfac.placement = bubbles");
  if (kfac.distributed != "spd-kfac") {
    require(kfac.spd_pipelining, "kfac.spd_pipelining", "only applies with kfac.distributed = spd-kfac (got {})",
            kfac.distributed);
    require(kfac.spd_balance, "kfac.spd_balance", "only applies with kfac.distributed = spd-kfac (got {})",
            kfac.distributed);
  }
}

void Config::check_files() const {
  namespace fs = std::filesystem;
  // Only whether they exist: what else a token file must be (a regular file, its size, its ids) is
  // map_token_file's check (data/token_file.hpp), which names the key and the file.
  if (!fs::exists(data.train_file))
    usage_error("data.train_file", "no such file '{}' (scripts/prepare-data.sh makes it)", data.train_file);
  if (!fs::exists(data.valid_file))
    usage_error("data.valid_file", "no such file '{}' (scripts/prepare-data.sh makes it)", data.valid_file);
  if (!kfac.plan_profile.empty() && !fs::is_regular_file(kfac.plan_profile))
    usage_error("kfac.plan_profile", "no such file '{}' (a PipeFisher run writes out_dir/kfac_profile.json)",
                kfac.plan_profile);
}

std::string Config::to_toml() const {
  auto ints = [](const std::vector<int>& v) {
    toml::array a;
    for (int x : v) a.push_back(x);
    return a;
  };
  toml::table t{
      {"model", toml::table{{"preset", model.preset}, {"arch", model.arch}, {"layers", model.layers},
                            {"hidden", model.hidden}, {"heads", model.heads}, {"ffn", model.ffn},
                            {"seq_len", model.seq_len}, {"max_position", model.max_position},
                            {"vocab", model.vocab}, {"type_vocab", model.type_vocab},
                            {"dropout", float_as_written(model.dropout)}, {"layer_norm_eps", float_as_written(model.layer_norm_eps)},
                            {"init_std", float_as_written(model.init_std)}, {"gelu", model.gelu}}},
      {"data", toml::table{{"vocab", data.vocab}, {"train_file", data.train_file},
                           {"valid_file", data.valid_file}, {"shuffle", data.shuffle},
                           {"mask_prob", float_as_written(data.mask_prob)}, {"nsp", data.nsp}, {"seed", int64_t(data.seed)}}},
      {"optim", toml::table{{"name", optim.name}, {"lr", optim.lr}, {"warmup_steps", optim.warmup_steps},
                            {"decay_power", optim.decay_power}, {"decay_steps", optim.decay_steps},
                            {"weight_decay", optim.weight_decay},
                            {"beta1", optim.beta1}, {"beta2", optim.beta2}, {"eps", optim.eps},
                            {"momentum", optim.momentum}, {"grad_clip", optim.grad_clip}}},
      {"train", toml::table{{"steps", train.steps}, {"seed", int64_t(train.seed)}, {"threads", train.threads},
                            {"deterministic", train.deterministic}, {"log_every", train.log_every},
                            {"eval_every", train.eval_every}, {"eval_batches", train.eval_batches},
                            {"out_dir", train.out_dir}, {"log_json", train.log_json},
                            {"checkpoint_dir", train.checkpoint_dir},
                            {"checkpoint_every", train.checkpoint_every},
                            {"keep_checkpoints", train.keep_checkpoints},
                            {"on_nonfinite", train.on_nonfinite}}},
      {"parallel", toml::table{{"stages", parallel.stages}, {"data_parallel", parallel.data_parallel},
                               {"schedule", parallel.schedule}, {"schedule_file", parallel.schedule_file},
                               {"micro_batches", parallel.micro_batches},
                               {"micro_batch_size", parallel.micro_batch_size},
                               {"virtual_stages", parallel.virtual_stages},
                               {"partition", ints(parallel.partition)}, {"recompute", parallel.recompute},
                               {"backward_forward_ratio", parallel.backward_forward_ratio}}},
      {"kfac", toml::table{{"enabled", kfac.enabled}, {"damping", kfac.damping}, {"ema", kfac.ema},
                           {"kl_clip", kfac.kl_clip}, {"inverse_every", kfac.inverse_every},
                           {"diag_limit", kfac.diag_limit}, {"placement", kfac.placement},
                           {"distributed", kfac.distributed}, {"spd_pipelining", kfac.spd_pipelining},
                           {"spd_balance", kfac.spd_balance}, {"warmup_steps", kfac.warmup_steps},
                           {"replan_on_drift", kfac.replan_on_drift}, {"split_inversions", kfac.split_inversions},
                           {"plan_profile", kfac.plan_profile}}},
  };
  // toml++ prints doubles with 17 digits (0.10000000000000001): the tables are written here, the
  // doubles in their shortest exact form, everything else (quoting, arrays) by toml++.
  std::ostringstream ss;
  for (auto&& [name, table] : t) {
    ss << (ss.tellp() > 0 ? "\n" : "") << "[" << name.str() << "]\n";
    for (auto&& [k, v] : *table.as_table()) {
      ss << k.str() << " = ";
      if (const auto* d = v.as_floating_point()) ss << shortest_double(d->get());
      else v.visit([&](auto&& x) { ss << x; });
      ss << "\n";
    }
  }
  return ss.str();
}

double float_as_written(float f) { return std::stod(fmt::format("{}", f)); }

std::string shortest_double(double d) {
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
  std::string s = fmt::format("{}", d);  // fmt's default: the shortest round-trip form
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // stays a float in TOML
  return s;
}

std::string preset_of(const ModelConfig& m) {
  ModelConfig p;
  for (const std::string& name : model_preset_names()) {
    apply_model_preset(p, name);
    if (p.arch == m.arch && p.layers == m.layers && p.hidden == m.hidden && p.heads == m.heads && p.ffn == m.ffn &&
        p.vocab == m.vocab && p.max_position == m.max_position)
      return name;
  }
  return m.preset.empty() ? "custom" : "custom (" + m.preset + ", resized)";
}

std::string optimizer_of(const Config& c) {
  if (!c.kfac.enabled) return c.optim.name;
  if (c.kfac.placement == "bubbles") return c.optim.name + " + K-FAC (in the pipeline bubbles: PipeFisher)";
  const std::string where =
      c.kfac.placement == "skip" ? fmt::format("skip: refreshed every {} steps", c.kfac.inverse_every) : "inline";
  // Stages with several copies (replicas, Chimera's twins) share factors and inversions by kfac.distributed.
  const bool copies = c.parallel.data_parallel > 1 || c.parallel.schedule == "chimera";
  return fmt::format("{} + K-FAC ({}{})", c.optim.name, where, copies ? ", " + c.kfac.distributed : "");
}

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> w;
  // The warm-up in effect (make_run_lr_schedule): K-FAC's own when it sets one.
  const bool kfac_own = c.kfac.enabled && c.kfac.warmup_steps >= 0;
  const int warmup = kfac_own ? c.kfac.warmup_steps : c.optim.warmup_steps;
  if (warmup > c.train.steps)
    w.push_back(fmt::format("{} = {} exceeds train.steps = {}: the learning rate never reaches optim.lr = {}",
                            kfac_own ? "kfac.warmup_steps" : "optim.warmup_steps", warmup, c.train.steps,
                            shortest_double(c.optim.lr)));
  // One stage runs each micro-batch's backward right after its forward: one micro-batch's
  // activations are held either way, so there is nothing to recompute.
  if (c.parallel.recompute && c.parallel.stages == 1)
    w.push_back("parallel.recompute = true has no effect with parallel.stages = 1: each micro-batch's backward "
                "follows its forward, so only one micro-batch's activations are held anyway");
  return w;
}

}  // namespace pf
