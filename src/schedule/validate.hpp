#pragma once
// The validator: a schedule is sound if
//   - every action names a pipeline, stage and micro-batch in range, on the device that hosts
//     its stage;
//   - every micro-batch runs in exactly one pipeline, and on every stage of it gets exactly one
//     F and either one B or one I and one W;
//   - playing it with blocking communication (unit steps, deps.hpp) finishes: no action waits
//     for one placed later on its own device (a swapped dependency) and no devices wait for each
//     other in a cycle (deadlock).
// A refusal carries a one-line reason and the device x step grid with the offending cell marked
// as *token* (and other blocked cells as >token< for a deadlock).
#include "core/error.hpp"
#include "schedule/schedule.hpp"

#include <string>

namespace pf {

struct ScheduleError : UsageError {
  ScheduleError(const std::string& reason, std::string grid_text)
      : UsageError("schedule: " + reason), grid(std::move(grid_text)) {}
  std::string grid;  // multi-line, printed before the one-line reason
};

// Throws ScheduleError if unsound.
void validate(const Schedule& s);

struct Cell {
  int device = -1;
  int index = -1;
};
// The device x step grid (unit steps where the schedule runs, positions after that), with
// `marked` shown as *token* and each of `blocked` as >token<. Wide grids show a window
// around the marked cell.
std::string render_grid(const Schedule& s, Cell marked = {}, const std::vector<Cell>& blocked = {});

}  // namespace pf
