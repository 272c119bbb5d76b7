#pragma once
// A pipeline schedule as plain data: for each device, the ordered list of actions it runs in one
// training step, plus where each (pipeline, stage) lives. Generators (generators.hpp) build it,
// validate() (validate.hpp) proves it sound, the simulator (sim/) times it, the runtime executes
// it, the PipeFisher planner inserts K-FAC actions into it.
//
// Text form (to_text / parse_text): a header line and one line per device, e.g.
//   # pipefisher schedule name=1f1b devices=2 stages=2 pipelines=1 micro_batches=2
//   # map p0: 0 1
//   0: 0F0 0F1 0B0 0B1
//   1: 1F0 1B0 1F1 1B1
// "# map pP: d0 d1 ..." gives the device of each stage of pipeline P (default: stage s on device
// s mod devices, pipeline 1 mirrored as Chimera's up pipeline). Other '#' lines are comments.
//
// CSV form (to_csv / parse_csv): the same '#' header lines, then one row per device: the device
// index, then one cell per unit-time step (the step each action runs at when every action takes
// one unit, see unit_steps in deps.hpp): an action token, or empty for an idle step. Reading
// ignores empty cells, so the alignment is only for people; both forms round-trip exactly.
#include "schedule/action.hpp"

#include <string>
#include <vector>

namespace pf {

struct Schedule {
  std::string name;                              // generator name or "file"
  int devices = 0;
  int stages = 0;                                // stages per pipeline
  int pipelines = 1;                             // 2 for Chimera
  int micro_batches = 0;                         // N per step (all pipelines together)
  std::vector<std::vector<int>> stage_device;    // [pipeline][stage] -> device
  std::vector<std::vector<Action>> per_device;   // [device] -> actions in order

  int device_of(int pipeline, int stage) const { return stage_device[pipeline][stage]; }
  size_t num_actions() const;
};

// The default placement: stage s of pipeline 0 on device s % devices; pipeline 1 (Chimera's up
// pipeline) mirrored, stage s on device devices-1-(s % devices).
std::vector<std::vector<int>> default_stage_device(int devices, int stages, int pipelines);

std::string to_text(const Schedule& s);
Schedule parse_text(const std::string& text, const std::string& source);
std::string to_csv(const Schedule& s);
Schedule parse_csv(const std::string& text, const std::string& source);
// Reads a schedule file: ".csv" as CSV (ours, or torch.distributed.pipelining's: torch_csv.hpp),
// anything else as text. UsageError names the file.
Schedule read_schedule_file(const std::string& path, const std::string& what = "--schedule-file");

// A schedule file's bounds, so that a hostile one (63 MiB of commas) costs time and memory in
// proportion to a real schedule, not 2 GB: at most kMaxScheduleFileBytes, and kMaxScheduleCells
// cells (actions and idle slots; the simulator takes 4M actions at most, sim/limits.hpp).
constexpr size_t kMaxScheduleFileBytes = size_t{16} << 20;
constexpr int64_t kMaxScheduleCells = 4'000'000;
// Adds `more` cells to the count `cells` of the file `source`, before they are stored;
// UsageError naming it past kMaxScheduleCells.
void count_schedule_cells(int64_t& cells, int64_t more, const std::string& source);

}  // namespace pf
