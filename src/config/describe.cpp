// describe_config: the key table as a reference, generated so that it cannot drift from the keys.
#include "config/config.hpp"
#include "config/config_keys.hpp"

#include <fmt/format.h>

#include <map>
#include <sstream>
#include <type_traits>

namespace pf {

using key_table::Bounds;
using key_table::for_each_key;

namespace {

template <typename T>
std::string type_text(const Bounds& b) {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_integral_v<T>) return b.auto_word ? "integer or auto" : "integer";
  else if constexpr (std::is_floating_point_v<T>) return "number";
  else if constexpr (std::is_same_v<T, std::string>) return b.path ? "path" : "string";
  else if constexpr (ConfigEnum<T>) return "one of " + names_of<T>();
  else if constexpr (std::is_same_v<T, std::optional<Gelu>>) return "one of " + names_of<Gelu>() + ", or empty";
  else return "list of integers";
}

std::string number(double v) { return fmt::format("{:g}", v); }

// The values a key's own bounds allow ("" where only the other keys limit it, or its type says all).
template <typename T>
std::string allowed_text(const Bounds& b) {
  if (!b.refusal) return "";
  if constexpr (std::is_same_v<T, std::string>) return "not empty";
  else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (b.hi == key_table::kInf) return (b.lo_open ? "> " : ">= ") + number(b.lo) + (b.auto_word ? ", or auto" : "");
    return fmt::format("{}{}, {}{}", b.lo_open ? "(" : "[", number(b.lo), number(b.hi), b.hi_open ? ")" : "]");
  } else {
    return "";
  }
}

// Each key's default as config.toml writes it ("model.hidden" -> "256").
std::map<std::string, std::string> default_texts() {
  std::map<std::string, std::string> out;
  std::istringstream toml(Config{}.to_toml());
  std::string table;
  for (std::string line; std::getline(toml, line);) {
    if (line.size() > 2 && line.front() == '[') table = line.substr(1, line.size() - 2);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[table + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

}  // namespace

std::string describe_config() {
  const Config defaults;
  const std::map<std::string, std::string> shown = default_texts();
  std::string out =
      "# Configuration keys\n\n"
      "Every key of a configuration (a TOML file, `--set key=value` over it), with its type, default,\n"
      "the values its own bounds allow and what it does. Generated from the key table\n"
      "(`src/config/config_keys.hpp`) by `pipefisher config --describe > docs/config.md`; a test fails\n"
      "when this file is stale. Relations between keys (`model.hidden` divisible by `model.heads`,\n"
      "`model.seq_len` at most `model.max_position`, ...) are checked too, each refusal naming its key.\n"
      "A key that moved still reads under its old name (`kfac.placement` is `precond.placement`); a file\n"
      "that sets both names to different values is refused, and `--set` under either name wins over the file.\n";
  std::string table;
  for_each_key(defaults, [&](const char* key, const auto& v, const Bounds& b, const char* doc) {
    using T = std::decay_t<decltype(v)>;
    const std::string k = key, section = k.substr(0, k.find('.'));
    if (section != table) {
      table = section;
      out += fmt::format("\n## [{}]\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n", table);
    }
    const std::string old = old_key_name(k), was = old.empty() ? "" : fmt::format(" (old name: `{}`)", old);
    out += fmt::format("| `{}` | {} | `{}` | {} | {}{} |\n", k, type_text<T>(b), shown.at(k), allowed_text<T>(b), doc, was);
  });
  return out;
}

}  // namespace pf
