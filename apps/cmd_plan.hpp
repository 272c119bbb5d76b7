#pragma once
// `pipefisher plan`'s flags and the parts its files share: cmd_plan.cpp (schedule, simulation,
// reports), cmd_plan_inputs.cpp (profiles, --sweep) and cmd_plan_kfac.cpp (--kfac: PipeFisher
// planned on the simulated step).
#include "config/config.hpp"
#include "schedule/schedule.hpp"
#include "sim/profile.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

namespace pf::app {

struct PlanArgs {
  std::string schedule, schedule_file, profile, svg, trace, csv, model = "bert-base";
  std::string csv_format = "pipefisher";  // --csv-format: ours, or torch.distributed.pipelining's
  int stages = 0, micro_batches = 0, virtual_stages = 0, micro_batch_size = 0, layers_per_stage = 0;
  double tf = 1, tb = 2, tw = 0, tcomm = 0, tcurv = 0, tinv = 0, tprec = 0;
  bool json = false, sweep = false, kfac = false, no_kfac = false, split_to_shorten = false, no_stage_group = false, recompute = false;
  int data_parallel = 1;
  int svg_steps = 0, svg_width = 0;  // --steps, --width: what --svg draws (0: its defaults)
  double margin = 0.05;
  double zb_memory = 1;  // --zb-memory: zb-auto's memory limit, times 1F1B's peak
  double bcast_alpha = -1, bcast_beta = -1;  // < 0: the profile's all-reduce alpha / beta
  std::vector<int> sweep_stages = {4, 8, 16, 32};
  CLI::App* app = nullptr;
  std::set<std::string> from_profile;  // flags whose value came from the profile's run
  bool recompute_measured = false;     // the profile's backward times already include R
  bool given(const char* flag) const { return app->count(flag) > 0; }
  bool has(const char* flag) const { return given(flag) || from_profile.count(flag) > 0; }
};

// The inputs (cmd_plan_inputs.cpp): a JSON profile naming its run fills every shape flag not
// given; the profiles to use (--profile: all CSV rows in a sweep, else the row of
// --micro-batch-size; or one built from the time flags); the one profile of a schedule's
// simulation, with --recompute's extra forward in each backward.
void apply_profile_run(PlanArgs& a);
std::vector<Profile> load_profiles(const PlanArgs& a);
Profile profile_of(const PlanArgs& a);
// --sweep: the paper's performance model over --sweep-stages (cmd_plan_inputs.cpp).
int run_sweep_mode(const PlanArgs& a);
// The files --svg, --trace and --csv wrote (text mode: the JSON's reader named them).
void print_outputs(const PlanArgs& a);

// --model's preset; UsageError naming the presets for an unknown one.
ModelConfig model_preset(const std::string& name);

// --kfac: plan PipeFisher on the simulated step and report it (JSON `kfac`, summary, drawings).
nlohmann::json run_kfac(const PlanArgs& a, const Schedule& s, const Profile& prof, const std::string& title,
                        double base_bubble);
// The text report of run_kfac's JSON.
void print_kfac(const nlohmann::json& k);

}  // namespace pf::app
