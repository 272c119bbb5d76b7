#pragma once
// Error types. A UsageError is something the user can fix (a config key, a CLI flag, a malformed
// file): the CLI prints its one-line message and exits with status 2. Anything else is a bug or an
// environment failure and exits with status 1.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace pf {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws UsageError("<what>: <message>") — `what` names the key, flag or file at fault.
template <typename... Args>
[[noreturn]] void usage_error(const std::string& what, fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(what + ": " + fmt::format(f, std::forward<Args>(args)...));
}

// Internal invariant; failing means a bug in pipefisher, not bad input.
#define PF_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw std::logic_error(fmt::format("{}:{}: check failed: {}: {}", __FILE__, __LINE__,   \
                                         #cond, fmt::format(__VA_ARGS__)));                   \
  } while (0)

}  // namespace pf
