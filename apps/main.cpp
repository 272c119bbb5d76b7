// pipefisher: the command-line program. Subcommands live in apps/cmd_*.cpp.
#include "command.hpp"
#include "core/error.hpp"
#include "core/machine.hpp"
#include "core/suggest.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>

namespace pf::app {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

namespace {

// The (sub)command whose arguments were being parsed: the deepest one that got any.
CLI::App* parsed_command(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands()) return sub;
  return &app;
}

// An argument nobody took: "--stpes" -> "unknown flag --stpes (did you mean --steps?)", naming
// the flag the user typed (CLI11's message lists every leftover, values first).
std::string extras_message(CLI::App& app, const CLI::ExtrasError& e) {
  CLI::App* cmd = parsed_command(app);
  const std::vector<std::string> left = cmd->remaining();
  auto flag = std::find_if(left.begin(), left.end(), [](const std::string& a) { return a.rfind("-", 0) == 0; });
  const std::string where = cmd == &app ? "" : cmd->get_name() + ": ";
  if (flag == left.end() && cmd == &app && !left.empty()) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    const std::string near = closest_match(left.front(), names);
    return "unknown command '" + left.front() + "'" + (near.empty() ? "" : " (did you mean " + near + "?)");
  }
  if (flag == left.end())
    return left.empty() ? e.what() : where + "unexpected argument '" + left.front() + "'";
  std::vector<std::string> names;
  for (const CLI::Option* o : cmd->get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  const std::string word = flag->substr(0, flag->find('='));
  const std::string near = closest_match(word, names);
  return where + "unknown flag " + word + (near.empty() ? "" : " (did you mean " + near + "?)") +
         (cmd == &app ? "" : "; see pipefisher " + cmd->get_name() + " --help");
}

// A command whose output could not be written (a full disk, `> /dev/full`, a closed pipe's
// reader gone) failed: it exits 2 with a line saying so, never 0. stdout is buffered when
// redirected, so the failure may show only at this last flush.
int checked_stdout(int status) {
  const int earlier = errno;  // most likely the failed write's, when an earlier one failed
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int e = flushed ? earlier : errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return status;
  std::fprintf(stderr, "pipefisher: cannot write the output (stdout): %s\n",
               e != 0 ? std::strerror(e) : "a write to it failed");
  return status == 0 ? 2 : status;
}

}  // namespace

int run_main(int argc, char** argv);  // the command line, below
}  // namespace pf::app

int main(int argc, char** argv) { return pf::app::checked_stdout(pf::app::run_main(argc, argv)); }

int pf::app::run_main(int argc, char** argv) {
  // A file-size limit (ulimit -f) would kill the process silently at the write that crosses it;
  // ignored, the write fails with EFBIG and is refused like a full disk, naming the file.
  std::signal(SIGXFSZ, SIG_IGN);
  pf::fit_process_to_machine(argv);  // may re-execute once: before MPI, threads or any BLAS call
  using namespace pf::app;
  CLI::App app{"pipefisher: pipeline-parallel transformer training with K-FAC in the bubbles\n"
               "  pipefisher train          the default job: a short bert-mini pretraining run\n"
               "  pipefisher COMMAND --help the flags of a command"};
  app.set_version_flag("--version", "pipefisher 0.1");
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runners.emplace_back(sub, c.setup(*sub));
  }
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    std::fprintf(stderr, "pipefisher: %s\n", extras_message(app, e).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "pipefisher: %s\n", e.what());
    return 2;
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
    // A bare call: what there is to do (the default job is `pipefisher train`).
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const pf::UsageError& e) {
    std::fprintf(stderr, "pipefisher: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipefisher: internal error: %s\n", e.what());
    return 1;
  }
}
