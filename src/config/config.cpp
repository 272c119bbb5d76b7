// Reading a configuration: TOML text or file, presets, --set overrides, defaults, and printing it
// back (to_toml). What a configuration must satisfy is validate.cpp.
#include "config/config.hpp"

#include "config/config_keys.hpp"
#include "config/paths.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "core/suggest.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

namespace pf {


namespace {

using namespace key_table;

struct Preset {
  const char* name;
  Arch arch;
  int layers, hidden, heads, ffn, vocab, max_position;
  int kv_heads = 0;  // 0: heads
};
constexpr Preset kPresets[] = {
    {"bert-tiny", Arch::Bert, 2, 128, 2, 512, 30522, 512},
    {"bert-mini", Arch::Bert, 4, 256, 4, 1024, 30522, 512},
    {"bert-small", Arch::Bert, 4, 512, 8, 2048, 30522, 512},
    {"bert-medium", Arch::Bert, 8, 512, 8, 2048, 30522, 512},
    {"bert-base", Arch::Bert, 12, 768, 12, 3072, 30522, 512},
    {"bert-large", Arch::Bert, 24, 1024, 16, 4096, 30522, 512},
    {"gpt2-tiny", Arch::Gpt, 2, 128, 2, 512, 50257, 1024},
    {"gpt2-mini", Arch::Gpt, 4, 256, 4, 1024, 50257, 1024},
    {"gpt2-small", Arch::Gpt, 12, 768, 12, 3072, 50257, 1024},
    {"gpt2-medium", Arch::Gpt, 24, 1024, 16, 4096, 50257, 1024},
    // Llama-style shapes of gpt2-tiny's and gpt2-mini's size: heads of 64, two queries per
    // key/value head, a SwiGLU of three matrices of 3 x hidden (about GPT's two of 4 x hidden).
    {"llama-tiny", Arch::Llama, 2, 128, 2, 384, 50257, 1024, 1},
    {"llama-mini", Arch::Llama, 4, 256, 4, 768, 50257, 1024, 2},
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

// A setting's refusal: the names it accepts, and the nearest one when the text looks like a typo.
template <ConfigEnum E>
[[noreturn]] void refuse_name(const std::string& key, const std::string& text, const Bounds& b) {
  if (b.refusal) usage_error(key, fmt::runtime(b.refusal), text);
  std::vector<std::string> names;
  for (const auto& n : EnumNames<E>::table) names.push_back(n.name);
  // (A text much longer than every name is no typo of one; edit_distance would take long.)
  const std::string near = text.size() > 32 ? std::string() : closest_match(text, names);
  usage_error(key, "'{}' is not one of {}{}", text, names_of<E>(), near.empty() ? "" : " (did you mean " + near + "?)");
}

// A key's value as config.toml holds it (a float as written: 0.15f -> 0.15).
template <typename T>
auto toml_value(const T& v) {
  if constexpr (std::is_same_v<T, float>) return float_as_written(v);
  else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, double> || std::is_same_v<T, std::string>) return v;
  else if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(v);
  else if constexpr (ConfigEnum<T>) return name_of(v);
  else if constexpr (std::is_same_v<T, std::optional<Gelu>>) return v ? name_of(*v) : std::string();
  else {
    toml::array a;
    for (int x : v) a.push_back(x);
    return a;
  }
}

// Reads typed values by dotted key and remembers which keys exist, so that anything left in the
// file afterwards is an unknown key.
class Reader {
 public:
  explicit Reader(const toml::table& t) : root_(t) {}

  template <typename T>
  void get(const std::string& key, T& out, const Bounds& bounds = kAny) {
    known_.insert(key);
    toml::node_view<const toml::node> n = root_.at_path(key);
    if (!n) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!n.is_boolean()) usage_error(key, "expected true or false");
      out = *n.value<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      out = integer<T>(key, n, bounds);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n.is_number()) usage_error(key, "expected a number");
      const double v = *n.value<double>();
      // inf and nan are TOML numbers; so is 1e39, which a float key turns into inf. Every real
      // key ends up in single-precision arithmetic (a learning rate times float32 weights), so
      // double keys are held to the same bound.
      if (!std::isfinite(v)) usage_error(key, "must be a finite number (got {})", v);
      if (std::abs(v) > static_cast<double>(std::numeric_limits<float>::max()))
        usage_error(key, "must be a finite number within single precision (|x| < 3.4e38) (got {})", v);
      if (v != 0 && static_cast<float>(v) == 0.0f)  // 1e-50 passes "> 0" but is 0 where it is used
        usage_error(key, "{} is 0 in single precision, the arithmetic it is used in (|x| >= 1.4e-45, or 0)", v);
      out = static_cast<T>(v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!n.is_string()) usage_error(key, "expected a string");
      out = *n.value<std::string>();
      if (!printable_text(out)) usage_error(key, "must be UTF-8 text without NUL characters");
    } else if constexpr (ConfigEnum<T>) {
      std::string text;
      get(key, text);
      const std::optional<T> v = parse_name<T>(text);
      if (!v) refuse_name<T>(key, text, bounds);
      out = *v;
    } else if constexpr (std::is_same_v<T, std::optional<Gelu>>) {
      std::string text;  // "" = the architecture's own
      get(key, text);
      if (!text.empty()) out.emplace(), get(key, *out, bounds);
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

  // Set under its name or its old one (current_key_name).
  bool has(const std::string& key) const {
    const std::string old = old_key_name(key);
    return present(key) || (!old.empty() && present(old));
  }

  // A key read under its name or its old one; both set to different values is refused naming both.
  template <typename T>
  void get_either(const std::string& key, T& out, const Bounds& bounds) {
    const std::string old = old_key_name(key);
    if (old.empty() || !present(old)) return get(key, out, bounds);
    known_.insert(key);
    if (!present(key)) return get(old, out, bounds);
    T mine = out, theirs = out;
    get(key, mine, bounds);
    get(old, theirs, bounds);
    if (!same_value(mine, theirs, bounds))
      usage_error(key, "set twice with different values, as {} = {} and as {} = {} (its old name): keep one", key,
                  shown(key), old, shown(old));
    out = mine;
  }

  // An integer key's value in T's range; with bounds.auto_word also the word "auto", as 0.
  template <typename T>
  static T integer(const std::string& key, const toml::node_view<const toml::node>& n, const Bounds& bounds) {
    if (bounds.auto_word && n.is_string()) {
      if (*n.value<std::string>() != "auto") usage_error(key, "expected an integer or 'auto'");
      return static_cast<T>(kAutoDataParallel);
    }
    if (!n.is_integer() && bounds.auto_word) usage_error(key, "expected an integer or 'auto'");
    if (!n.is_integer()) usage_error(key, "expected an integer");
    const int64_t v = *n.value<int64_t>();
    if (bounds.auto_word && v == kAutoDataParallel) usage_error(key, fmt::runtime(bounds.refusal), v);
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
      usage_error(key, "{} is out of range", v);
    return static_cast<T>(v);
  }

  void refuse_unknown() const { walk(root_, ""); }

 private:
  bool present(const std::string& key) const { return static_cast<bool>(root_.at_path(key)); }
  std::string shown(const std::string& key) const {
    std::ostringstream s;
    s << root_.at_path(key);
    return s.str();
  }
  // A path the same file either way: a file's (already against its directory) or --set's (against
  // the current one).
  template <typename T>
  static bool same_value(const T& a, const T& b, const Bounds& bounds) {
    if constexpr (std::is_same_v<T, std::string>)
      if (bounds.path) return absolute_path(a) == absolute_path(b);
    return a == b;
  }
  void walk(const toml::table& t, const std::string& prefix) const {
    for (auto&& [k, v] : t) {
      std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (const toml::table* sub = v.as_table()) {
        // A top table, or a table of keys inside one (optim.soap.*).
        if (prefix.empty() ? kTables.count(key) > 0 : holds_keys(key)) {
          walk(*sub, key);
          continue;
        }
        if (prefix.empty()) {
          const std::string near = closest_match(key, kTables);
          if (!near.empty()) usage_error(key, "unknown configuration table (did you mean [{}]?)", near);
        }
      }
      if (known_.count(key)) continue;
      const std::string near = nearest_key(key);
      if (near.empty()) usage_error(key, "unknown configuration key");
      usage_error(key, "unknown configuration key (did you mean {}?)", near);
    }
  }
  // The key a misspelt one probably means, by its current name ("kfac.placment": precond.placement).
  std::string nearest_key(const std::string& key) const {
    std::set<std::string> names = known_;
    for (const std::string& k : known_)
      if (const std::string old = old_key_name(k); !old.empty()) names.insert(old);
    return current_key_name(closest_match(key, names));
  }
  bool holds_keys(const std::string& table) const {
    const auto it = known_.lower_bound(table + ".");
    return it != known_.end() && it->rfind(table + ".", 0) == 0;
  }
  static inline const std::set<std::string> kTables = {"model", "data", "optim", "train", "parallel", "kfac", "precond"};
  const toml::table& root_;
  std::set<std::string> known_;
};


// The dotted key of a `key=value` override, without the spaces before '=' ("" without '=').
std::string override_key(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos) return "";
  std::string key = kv.substr(0, eq);
  while (!key.empty() && key.back() == ' ') key.pop_back();
  return key;
}

// The key's other name (its old one, or for an old name its current one), dropped from the tree:
// a --set wins over the file, and a later --set over an earlier one, whichever name each used.
void drop_other_name(toml::table& root, const std::string& key) {
  std::string other = old_key_name(key);
  if (other.empty() && current_key_name(key) != key) other = current_key_name(key);
  if (other.empty()) return;
  const size_t dot = other.rfind('.');
  if (toml::table* t = root.at_path(other.substr(0, dot)).as_table()) t->erase(other.substr(dot + 1));
}

// Applies one `key=value` override; the value is parsed as TOML (so 4, 1e-3, true, "x", [1,2]
// work) and otherwise taken as a bare string.
void apply_override(toml::table& root, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) usage_error("--set " + kv, "expected key=value");
  const std::string key = override_key(kv), text = kv.substr(eq + 1);
  drop_other_name(root, key);
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

// The defaults that follow other keys, before the keys are read over them: a preset's sizes, and
// an architecture's own vocabulary and tables (explicit keys win).
Config defaults_for(Reader& r) {
  Config c;
  auto& m = c.model;
  r.get("model.preset", m.preset);
  if (!m.preset.empty()) apply_model_preset(m, m.preset);
  r.get("model.arch", m.arch);
  if (m.preset.empty() && causal_lm(m.arch)) {
    // An architecture without a preset takes its own vocabulary and table sizes.
    m.layer_norm_eps = 1e-5f;
    m.vocab = 50257;
    m.max_position = 1024;
  }
  return c;
}

// The defaults that follow keys read: the architecture's activation and tokenizer, the
// tokenizer's token files, K-FAC's placement with one stage (precond.placement).
void fill_unset(Config& c, const Reader& r) {
  auto& m = c.model;
  auto& d = c.data;
  m.gelu = gelu_of(m);
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (!r.has("data.vocab")) d.vocab = causal_lm(m.arch) ? Vocab::Gpt2 : Vocab::Bert;
  if (d.train_file.empty()) d.train_file = find_data("corpus/train." + name_of(d.vocab) + ".bin");
  if (d.valid_file.empty()) d.valid_file = find_data("corpus/valid." + name_of(d.vocab) + ".bin");
  m.nsp = d.nsp;
  m.mask_prob = d.mask_prob;
  // One stage has no bubbles: there K-FAC's default placement is inline (a pipeline's is
  // PipeFisher's bubbles). Without K-FAC the key keeps its default, so that config.toml does not
  // change with the layout.
  if (!r.has("precond.placement") && c.kfac.enabled) c.kfac.placement = default_kfac_placement(c.parallel.stages);
  // SOAP's work runs in its optimizer step unless a placement is asked for (docs/optimizers.md).
  if (!r.has("precond.placement") && !c.kfac.enabled && c.optim.name == OptimName::Soap) c.kfac.placement = Placement::Inline;
}

// `--set model.preset=P` over a file (a run's config.toml holds every size): P's sizes, not the file's.
void drop_preset_sizes(toml::table& root) {
  if (toml::table* m = root["model"].as_table())
    for (const char* k : {"arch", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_position", "layer_norm_eps"})
      m->erase(k);
}

// A config file's relative paths, against the file's directory (before the command line's
// overrides, which stay relative to the current directory).
void resolve_file_paths(toml::table& root, const std::string& dir) {
  const Config defaults;
  for_each_key(defaults, [&](const std::string& key, const auto&, const Bounds& b, const char*) {
    if (!b.path) return;
    for (const std::string& name : {key, old_key_name(key)}) {
      toml::table* t = name.empty() ? nullptr : root[name.substr(0, name.find('.'))].as_table();
      toml::value<std::string>* v = t ? t->get_as<std::string>(name.substr(name.find('.') + 1)) : nullptr;
      if (v) *v = absolute_path(v->get(), dir);
    }
  });
}

// `dir`: the config file's directory ("" for a text without a file).
Config from_table(toml::table& root, const std::vector<std::string>& overrides, const std::string& dir = "") {
  if (!dir.empty()) resolve_file_paths(root, dir);
  for (const auto& kv : overrides) {
    if (override_key(kv) == "model.preset") drop_preset_sizes(root);
    apply_override(root, kv);
  }
  Reader r(root);
  Config c = defaults_for(r);
  for_each_key(c, [&](const char* key, auto& member, const Bounds& b, const char*) { r.get_either(key, member, b); });
  fill_unset(c, r);
  for_each_key(c, [](const char*, auto& member, const Bounds& b, const char*) {
    if constexpr (std::is_same_v<std::decay_t<decltype(member)>, std::string>)
      if (b.path) member = absolute_path(member);
  });
  r.refuse_unknown();
  c.validate();
  return c;
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
    m.kv_heads = p.kv_heads;  // 0: model.heads, once the keys are read (fill_unset)
    m.ffn = p.ffn;
    m.vocab = p.vocab;
    m.max_position = p.max_position;
    m.layer_norm_eps = causal_lm(m.arch) ? 1e-5f : 1e-12f;
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
  // A configuration is kilobytes: /dev/zero or a FIFO is refused before it is read.
  const std::string text = read_input_file(path, "--config", size_t{16} << 20);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    usage_error(path, "line {}: {}", e.source().begin.line, std::string(e.description()));
  }
  return from_table(root, overrides, std::filesystem::absolute(path).parent_path().string());
}




std::string Config::to_toml() const {
  toml::table t;
  for_each_key(*this, [&](const std::string& key, const auto& v, const Bounds& b, const char*) {
    const size_t dot = key.find('.');
    toml::table* table = t.insert(key.substr(0, dot), toml::table{}).first->second.as_table();
    if constexpr (std::is_integral_v<std::decay_t<decltype(v)>>)
      if (b.auto_word && v == kAutoDataParallel) return void(table->insert(key.substr(dot + 1), "auto"));
    table->insert(key.substr(dot + 1), toml_value(v));
  });
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

Gelu gelu_of(const ModelConfig& m) { return m.gelu.value_or(causal_lm(m.arch) ? Gelu::Tanh : Gelu::Erf); }

int masked_per_sequence(int seq_len, float mask_prob) {
  const int body = seq_len - 2;
  return std::clamp(static_cast<int>(std::lround(mask_prob * body)), 1, body);
}

int labelled_per_sequence(const ModelConfig& model, int seq_len) {
  if (causal_lm(model.arch)) return seq_len;
  return masked_per_sequence(model.nsp ? seq_len - 1 : seq_len, model.mask_prob);
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  const Config defaults;
  for_each_key(defaults, [&](const char* key, const auto&, const Bounds&, const char*) { keys.push_back(key); });
  return keys;
}

double float_as_written(float f) { return std::stod(fmt::format("{}", f)); }

std::string shortest_double(double d) {
  if (!std::isfinite(d)) return std::isnan(d) ? "nan" : (d > 0 ? "inf" : "-inf");
  std::string s = fmt::format("{}", d);  // fmt's default: the shortest round-trip form
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // stays a float in TOML
  return s;
}

}  // namespace pf
