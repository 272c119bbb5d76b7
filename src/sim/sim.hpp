#pragma once
// The timed simulator: plays a schedule (any kinds, including K-FAC and communication) with
// durations from a CostModel or given per action, every device following its order, an action
// starting when its device is free and everything it waits for (deps.hpp) has finished, plus a
// point-to-point delay when the data comes from another device. Collective groups start
// together. The resulting timeline gives each action's start and end, so a planner can find
// the bubbles (gaps) per device.
#include "schedule/schedule.hpp"
#include "sim/cost.hpp"

#include <vector>

namespace pf {

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
  // Measured only (kfac.placement = adaptive): a K-FAC unit run inside the wait of the receive at
  // this index of its row; -1 otherwise (and in every simulated or planned timeline).
  int in_wait_of = -1;
  // Measured only: the part of a pass spent in K-FAC's taps on its layers (ActionTime::taps), in
  // the timeline's unit; 0 otherwise.
  double taps = 0;
};

// An idle interval of one device in one step: the room other work (PipeFisher's K-FAC units)
// can take. Occupying = anything but point-to-point (a receive is a wait: idle; a collective
// keeps the device in the collective, though `busy` does not count it). `insert_at`: where an
// action running in the gap goes in the device's list (after the occupying action before the
// gap and the sends it started).
struct Gap {
  double start = 0, end = 0;
  int insert_at = 0;
  bool leading = false;  // before the device's first occupying action of the step
};

struct Timeline {
  std::vector<std::vector<TimedAction>> per_device;
  double step_time = 0;                // last end over all devices (the step starts at 0)
  std::vector<double> busy;            // compute time per device (SEND/RECV/collectives excluded)
  std::vector<double> bubble;          // step_time - busy
  std::vector<double> utilization;     // busy / step_time
  std::vector<int> peak_in_flight;     // max (stage, micro-batch) activations held: F start .. B/W end

  double mean_bubble() const;
  double mean_utilization() const;
  // Idle intervals of a device within [0, step_time], in order (Gap; longer than 1e-9).
  std::vector<Gap> gaps(int device) const;
};

// durations, if given, has the shape of s.per_device and overrides the cost model per action.
// Throws ScheduleError (with the grid) if the schedule cannot finish.
Timeline simulate(const Schedule& s, const CostModel& cost,
                  const std::vector<std::vector<double>>* durations = nullptr);

}  // namespace pf
