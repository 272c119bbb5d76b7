// `pipefisher plan` with fuzzed arguments: the input is the argument list, one argument per line
// (the seeds give flags and numbers: --tf 1e308, --stages 100000, --margin nan ...). The command
// must run, or refuse with a UsageError or a CLI11 parse error (exit 2 in the program); a crash,
// a sanitizer report, another exception or a timeout is a finding. Files: --svg, --trace and
// --csv write to this process's private path; --profile and --schedule-file are dropped (their
// formats have their own targets). The simulator's and planner's work limits are lowered so that
// every accepted input runs in milliseconds (the bounds themselves are tested in tests/faults).
#include "../apps/command.hpp"
#include "fuzz_common.hpp"
#include "sim/limits.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace pf::app {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace pf::app

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (!std::freopen("/dev/null", "w", stdout)) __builtin_trap();  // the plan's report
  pf::set_work_limits(20000, 2000, 500);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string out = "/tmp/pf_fuzz_plan_" + std::to_string(getpid());
  std::vector<std::string> args{"plan"};
  std::string cur;
  const std::string_view text = pf_fuzz::as_text(data, size);
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      if (!cur.empty() && args.size() < 64) args.push_back(cur);
      cur.clear();
    } else if (cur.size() < 64) {
      cur += text[i];
    }
  }
  std::vector<std::string> argv{"plan"};
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--profile", 0) == 0 || a.rfind("--schedule-file", 0) == 0 || a.rfind("--help", 0) == 0 || a == "-h") {
      ++i;  // and its value
      continue;
    }
    if (a == "--svg" || a == "--trace" || a == "--csv") {
      argv.push_back(a);
      argv.push_back(out + a.substr(1));
      ++i;
      continue;
    }
    if (a.rfind("--svg", 0) == 0 || a.rfind("--trace", 0) == 0 || a.rfind("--csv", 0) == 0) continue;  // --svg=PATH
    argv.push_back(a);
  }
  for (auto& c : pf::app::commands()) {
    if (c.name != "plan") continue;
    CLI::App app;
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    pf::app::Runner run = c.setup(*sub);
    std::vector<const char*> ptrs{"pipefisher"};
    for (const std::string& a : argv) ptrs.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(ptrs.size()), const_cast<char**>(ptrs.data()));
    } catch (const CLI::ParseError&) {
      return 0;  // the program prints it and exits 2
    }
    pf_fuzz::refuse_or_accept([&] { (void)run(); });
  }
  return 0;
}
