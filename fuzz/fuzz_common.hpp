#pragma once
// Shared by the libFuzzer targets: every loader must either accept the input or throw a
// UsageError (a clear message naming the file or key). Any other exception, a crash, or a
// sanitizer report is a bug: the harness lets it escape so that libFuzzer records the input.
#include "core/error.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace pf_fuzz {

// Loaders that take a path get the input through a file private to this process.
inline std::string write_input(const uint8_t* data, size_t size, const char* suffix = "") {
  static const std::string base = "/tmp/pf_fuzz_" + std::to_string(getpid());
  const std::string path = base + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs fn; a UsageError is the expected refusal of bad input.
template <typename F>
void refuse_or_accept(F&& fn) {
  try {
    fn();
  } catch (const pf::UsageError&) {
  }
}

}  // namespace pf_fuzz
