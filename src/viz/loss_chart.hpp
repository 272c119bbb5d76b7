#pragma once
// Training-loss curves of one or several runs, as the PipeFisher paper's Figure 7: loss vs steps
// (left) and vs training time (right), each run's raw loss thin and its smoothed loss
// (viz/smooth.hpp) thick, validation losses as dots, an optional target loss as a dashed line
// with the point where each smoothed curve first reaches it marked (step and time).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace pf {

struct LossCurve {
  std::string name;
  std::vector<double> step, time_s, loss;           // per logged step; time: cumulative training time;
                                                    // loss NaN for a skipped step (a gap)
  std::vector<double> valid_step, valid_time_s, valid_loss;
  std::vector<double> smoothed;                     // filled by smooth_curves
  double smoothing_cutoff = 0;                      // its filter's cutoff (viz/smooth.hpp's loss_filter_cutoff)
  int64_t skipped = 0;                              // steps whose loss was not finite
  bool cut_short = false;                           // the log's last line was cut off (viz/loss_log.hpp)
};

// Fills every curve's `smoothed` (smooth_loss: the paper's filter, a faster one on a short run)
// and `smoothing_cutoff`, run over the finite losses (a skipped step's NaN stays a gap and does
// not spread).
void smooth_curves(std::vector<LossCurve>& curves);

// The last finite value of a series, NaN if none (a run whose every step was skipped).
double last_finite(std::span<const double> values);

// Where a curve first reaches `target` (<=), linearly interpolated between the finite points
// that bracket it (gaps are stepped over); nothing if it never does. values: the curve to test
// (e.g. the smoothed loss).
struct Crossing {
  double step = 0, time_s = 0;
};
std::optional<Crossing> first_crossing(const LossCurve& c, std::span<const double> values, double target);

struct LossChartOptions {
  std::string title;
  std::optional<double> target;  // drawn, with each smoothed curve's crossing marked
};
std::string loss_chart_svg(const std::vector<LossCurve>& curves, const LossChartOptions& opt);
// Whether `svg` (a file's first bytes suffice) is a chart loss_chart_svg drew: its legend line,
// which every version has written, "thin: training loss per step".
bool is_loss_chart_svg(const std::string& svg);

// Round tick values covering [lo, hi]: about `count` of them at 1, 2 or 5 x 10^k.
std::vector<double> nice_ticks(double lo, double hi, int count);

}  // namespace pf
