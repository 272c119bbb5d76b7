#pragma once
// Renderings of a simulated timeline:
//   timeline_svg   like the paper's Figures 1, 3, 4: one row per device, one box per action
//                  coloured by kind with the micro-batch number, step boundaries, legend,
//                  utilization in the title; Chimera's up pipeline drawn hatched; a measured
//                  K-FAC unit that ran in a receive's wait (TimedAction::in_wait_of) has an
//                  amber bar in the send/receive lane under it, its title naming the receive
//   chrome_trace   Chrome trace-event JSON, opens in Perfetto: one process per device, with a
//                  "compute" thread (forward, backward, optimizer, K-FAC compute) and a
//                  "communication" thread (send/recv, all-reduce, curvature sync, broadcasts);
//                  several steps in one file, each marked on a "steps" track, K-FAC units named
//                  by their layer's name when given; a unit run in a wait has the awaited
//                  receive or all-reduce in args.in_wait_of, and a measured pass whose layers'
//                  K-FAC taps took time has it in args.kfac_taps_ms
//   timeline_text  a terminal rendering, one line per device
// Files are written by the caller through core/files.hpp (write_output).
#include "schedule/schedule.hpp"
#include "sim/sim.hpp"

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace pf {

struct SvgOptions {
  std::string title;        // e.g. "1f1b D=4 N=8"; utilization is appended
  std::string unit = "ms";
  int steps = 2;            // consecutive steps drawn (each starts when the previous one ends)
  // Pixels of the time axis; 0: wide enough that the (lower) median forward/backward box is 24 px (room
  // for its micro-batch number), at least 1200 and at most 16000, so long plans are not slivers.
  int width = 0;
  // If set: `tl` already spans several steps (a PipeFisher refresh period) starting at these
  // times; it is drawn once with a boundary at each (and `steps` is ignored).
  std::vector<double> step_starts;
  int first_step = 1;       // the number the first step drawn is labelled with (a measured step's own)
  // If set: the title's text after the name, instead of "step .., utilization .., bubble .."
  // of `tl` (a refresh period is not a step: the caller says what its numbers are).
  std::string summary;
};

// The time-axis width timeline_svg uses for `opt` (the given width, or the automatic one).
int timeline_width(const Timeline& tl, const SvgOptions& opt);

std::string timeline_svg(const Timeline& tl, const SvgOptions& opt);
// K-FAC layer names by (pipeline, stage, layer within the stage), e.g. "bert.encoder.layer.3.attention.self.query".
using LayerNames = std::map<std::tuple<int, int, int>, std::string>;

struct TraceStep {
  int step = 1;            // the number it is labelled with
  double start = 0;        // when it began, in the timeline's unit from the trace's origin
  const Timeline* timeline = nullptr;
  // [device] the plan's timeline of the step, or null: an action found in its device's row gets
  // args planned_start / planned_end (the plan's times from the step's start).
  const std::vector<std::vector<TimedAction>>* planned = nullptr;
};

std::string chrome_trace(const Timeline& tl, const std::string& name, double us_per_unit = 1000);
std::string chrome_trace(const std::vector<TraceStep>& steps, const std::string& name, const LayerNames& layers,
                         double us_per_unit = 1000);
// One line per device, at least `min_columns` wide and wider when a pass's label (F12) needs it
// (at most 1000 columns).
std::string timeline_text(const Timeline& tl, int min_columns = 100);

// Text for SVG/XML: & < > " escaped.
std::string xml_escape(const std::string& s);

}  // namespace pf
