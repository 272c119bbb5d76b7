#pragma once
// `pipefisher report --account PF_PROFILE_DIR --baseline NVLAMB_PROFILE_DIR [--json]`: the account
// of PipeFisher's measured step against NVLAMB's (sim/step_account.hpp), from two --profile-dirs,
// printed as tables (or one JSON object).
#include <string>

namespace pf::app {

int run_step_account(const std::string& profile_dir, const std::string& baseline_dir, bool json);

}  // namespace pf::app
