// Configuration TOML with `--set key=value` overrides, as `pipefisher train --config F --set ...`
// reads them: the input is the TOML text, then a NUL byte, then one override per line. The result
// must validate, pass or fail the resource check (memory and threads against this machine) with a
// UsageError, and print as TOML that loads back to the same configuration.
#include "config/config.hpp"
#include "config/limits.hpp"
#include "fuzz_common.hpp"

#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = pf_fuzz::as_text(data, size);
  const size_t nul = in.find('\0');
  const std::string text(in.substr(0, nul));
  std::vector<std::string> sets;
  if (nul != std::string_view::npos) {
    std::string cur;
    for (char c : in.substr(nul + 1)) {
      if (c == '\n') {
        if (!cur.empty()) sets.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) sets.push_back(cur);
  }
  pf::Config c;
  try {
    c = pf::Config::from_toml_string(text, sets);
  } catch (const pf::UsageError&) {
    return 0;
  }
  c.validate();  // loaded means valid: a UsageError here escapes as a finding
  pf_fuzz::refuse_or_accept([&] { pf::check_resources(c, 1, 1); });
  (void)pf::estimate_run_bytes(c, 4, 8);
  // What --print-config and config.toml show loads back unchanged.
  const std::string toml = c.to_toml();
  const pf::Config back = pf::Config::from_toml_string(toml);
  if (back.to_toml() != toml) __builtin_trap();
  return 0;
}
