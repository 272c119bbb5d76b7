#pragma once
// Error types. A UsageError is something the user can fix (a config key, a CLI flag, a malformed
// file): the CLI prints its one-line message and exits with status 2. Anything else is a bug or an
// environment failure and exits with status 1.
#include <fmt/format.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace pf {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A value as an error message repeats it: whole when short; longer than kMaxQuoted bytes (a 50 MB
// configuration string, a forged file's tensor name), its first 60 and last 20 bytes around "...",
// cut between UTF-8 characters, and its length, so that one bad value cannot flood the terminal.
inline constexpr size_t kMaxQuoted = 200;
inline std::string clip_for_message(std::string_view v) {
  if (v.size() <= kMaxQuoted) return std::string(v);
  auto continuation = [&](size_t i) { return (static_cast<unsigned char>(v[i]) & 0xC0) == 0x80; };
  size_t head = 60, tail = v.size() - 20;
  while (head > 0 && continuation(head)) --head;
  while (tail < v.size() && continuation(tail)) ++tail;
  return fmt::format("{}...{} ({} bytes)", v.substr(0, head), v.substr(tail), v.size());
}

namespace detail {
template <typename T>
auto clipped_arg(const T& a) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>)
    return clip_for_message(std::string_view(a));
  else
    return a;
}
}  // namespace detail

// Throws UsageError("<what>: <message>") — `what` names the key, flag or file at fault. Text
// arguments (and `what`) go through clip_for_message: every value an error repeats is bounded here.
template <typename... Args>
[[noreturn]] void usage_error(const std::string& what, fmt::format_string<Args...> f, Args&&... args) {
  const auto held = std::make_tuple(detail::clipped_arg(args)...);
  const std::string message =
      std::apply([&](const auto&... a) { return fmt::vformat(fmt::string_view(f), fmt::make_format_args(a...)); }, held);
  throw UsageError(clip_for_message(what) + ": " + message);
}

// Internal invariant; failing means a bug in pipefisher, not bad input.
#define PF_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw std::logic_error(fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__,   \
                                         #cond, fmt::format(__VA_ARGS__)));                   \
  } while (0)

}  // namespace pf
