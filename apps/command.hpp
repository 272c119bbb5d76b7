#pragma once
// Subcommand registry: each apps/cmd_<name>.cpp registers itself with PF_COMMAND, so adding a
// subcommand touches one file. `setup` declares the flags on its CLI11 subcommand and returns
// the function that runs it (its return value is the exit status).
#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace pf::app {

using Runner = std::function<int()>;
struct Command {
  std::string name;
  std::string help;
  std::function<Runner(CLI::App&)> setup;
};

std::vector<Command>& commands();

// Whole-number flags: CLI11's PositiveNumber and NonNegativeNumber print their range as
// "0.000000 to 1797693...", 300 digits of DBL_MAX; these say what is wanted.
inline CLI::Validator whole_number(long long lowest, const char* what) {
  return CLI::Validator(
      [lowest, what](std::string& s) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || v < lowest) return std::string("must be ") + what + ", got '" + s + "'";
        return "";
      },
      what);
}
inline const CLI::Validator kPositiveInteger = whole_number(1, "a positive integer");
inline const CLI::Validator kNonNegativeInteger = whole_number(0, "an integer >= 0");

struct Register {
  Register(std::string name, std::string help, std::function<Runner(CLI::App&)> setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace pf::app

#define PF_COMMAND(ident, name, help, setup_fn) \
  static ::pf::app::Register pf_command_##ident{name, help, setup_fn};
