// The old names of keys that moved (config.hpp: current_key_name): the one table of them.
#include "config/config.hpp"

namespace pf {

namespace {

// [precond] holds where and when a preconditioner's periodic work runs; while only K-FAC had
// such work its keys were K-FAC's. Configs, --set lines and saved config.toml files with the old
// names keep working.
struct KeyAlias {
  const char* old_name;
  const char* name;
};
constexpr KeyAlias kKeyAliases[] = {
    {"kfac.placement", "precond.placement"},
    {"kfac.replan_on_drift", "precond.replan_on_drift"},
    {"kfac.min_refresh_steps", "precond.min_refresh_steps"},
    {"kfac.max_refresh_steps", "precond.max_refresh_steps"},
    {"kfac.plan_profile", "precond.plan_profile"},
    {"kfac.refresh_record", "precond.refresh_record"},
};

}  // namespace

std::string current_key_name(const std::string& key) {
  for (const KeyAlias& a : kKeyAliases)
    if (key == a.old_name) return a.name;
  return key;
}

std::string old_key_name(const std::string& key) {
  for (const KeyAlias& a : kKeyAliases)
    if (key == a.name) return a.old_name;
  return "";
}

}  // namespace pf
