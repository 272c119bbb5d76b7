#pragma once
// Reading a training run's log.jsonl (train/run_log.hpp writes it) into a loss curve for
// `pipefisher report`: one JSON object per line with "step", "loss" and "step_time_s" (cumulated
// into the curve's time), and "valid_loss" on the steps that evaluated.
//
// Every log the program writes reads: a skipped step (non-finite loss, logged as null) stays in the
// curve as NaN, a gap in the chart, and is counted in LossCurve::skipped; a null valid_loss (a
// non-finite evaluation) is left out. Steps increase line by line (else a UsageError naming the
// line: lines out of order, two runs in one file). A last line without its newline that is not JSON (a run cut
// off mid-write, a full disk) is left out and flagged in LossCurve::cut_short. Anything else
// malformed (not a JSON object, a missing or mistyped field, a negative or absurd number) is a
// UsageError naming "path:line" and the field.
#include "viz/loss_chart.hpp"

#include <istream>
#include <string>

namespace pf {

// Numbers beyond this magnitude are no loss, step or duration the program logs (its losses are
// floats); refusing them keeps every difference the chart takes finite.
inline constexpr double kMaxLogValue = 1e100;

// The curve of the log read from `in`; `path` names it in errors. UsageError when it holds no step.
LossCurve read_loss_log(std::istream& in, const std::string& path);

}  // namespace pf
