#pragma once
// Subcommand registry: each apps/cmd_<name>.cpp registers itself with PF_COMMAND, so adding a
// subcommand touches one file. `setup` declares the flags on its CLI11 subcommand and returns
// the function that runs it (its return value is the exit status).
#include <CLI/CLI.hpp>

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

struct Register {
  Register(std::string name, std::string help, std::function<Runner(CLI::App&)> setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace pf::app

#define PF_COMMAND(ident, name, help, setup_fn) \
  static ::pf::app::Register pf_command_##ident{name, help, setup_fn};
