// pipefisher: the command-line program. Subcommands live in apps/cmd_*.cpp.
#include "command.hpp"
#include "core/error.hpp"
#include "core/machine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <exception>

namespace pf::app {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace pf::app

int main(int argc, char** argv) {
  pf::fit_process_to_machine(argv);  // may re-execute once: before MPI, threads or any BLAS call
  using namespace pf::app;
  CLI::App app{"pipefisher: pipeline-parallel transformer training with K-FAC in the bubbles"};
  app.set_version_flag("--version", "pipefisher 0.1");
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(*sub));
  }
  // With no subcommand, `pipefisher` runs the built-in default job (a short BERT pretraining run).
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "pipefisher: %s\n", e.what());
    return 2;
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
    for (auto& [sub, run] : runners)
      if (sub->get_name() == "train") return run();
    std::fprintf(stderr, "pipefisher: no subcommand given (see --help)\n");
    return 2;
  } catch (const pf::UsageError& e) {
    std::fprintf(stderr, "pipefisher: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipefisher: internal error: %s\n", e.what());
    return 1;
  }
}
