// `pipefisher config`: the resolved configuration (--config, --set), or with --describe every key's
// type, default, allowed values and meaning (markdown: docs/config.md is this output).
#include "command.hpp"
#include "config/config.hpp"
#include "core/error.hpp"

#include <cstdio>
#include <memory>

namespace {

struct ConfigArgs {
  std::string config;
  std::vector<std::string> sets;
  bool describe = false;
};

pf::app::Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<ConfigArgs>();
  cmd.add_option("--config", a->config, "TOML configuration file (default: the built-in default job)");
  cmd.add_option("--set", a->sets, "override a configuration key: --set model.layers=4 (repeatable)")
      ->allow_extra_args(false);
  cmd.add_flag("--describe", a->describe, "print every key's type, default, allowed values and meaning (markdown)");
  return [a] {
    if (a->describe) {
      if (!a->config.empty() || !a->sets.empty())
        pf::usage_error("--describe", "describes the keys themselves: give no --config or --set");
      std::fputs(pf::describe_config().c_str(), stdout);
      return 0;
    }
    std::fputs(pf::Config::load(a->config, a->sets).to_toml().c_str(), stdout);
    return 0;
  };
}

}  // namespace

PF_COMMAND(config, "config", "Print the resolved configuration, or with --describe what every key means", setup)
