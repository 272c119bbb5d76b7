// `pipefisher report`'s reading of a run's log.jsonl (viz/loss_log.hpp), then everything report
// does with the curve: smoothing, the target's crossing, the chart. A curve read must be
// consistent (a time per step, never decreasing; skipped steps counted; smoothed finite exactly
// where the loss is) and the chart must hold no NaN or Inf coordinate.
#include "fuzz_common.hpp"
#include "viz/loss_chart.hpp"
#include "viz/loss_log.hpp"

#include <cmath>
#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string(pf_fuzz::as_text(data, size))};
  pf_fuzz::refuse_or_accept([&] {
    std::vector<pf::LossCurve> curves{pf::read_loss_log(in, "log.jsonl")};
    pf::smooth_curves(curves);
    const pf::LossCurve& c = curves[0];
    const size_t n = c.step.size();
    if (n == 0 || c.time_s.size() != n || c.loss.size() != n || c.smoothed.size() != n) __builtin_trap();
    int64_t nan = 0;
    for (size_t i = 0; i < n; ++i) {
      nan += std::isnan(c.loss[i]);
      if (std::isfinite(c.loss[i]) != std::isfinite(c.smoothed[i])) __builtin_trap();
      if (!std::isfinite(c.time_s[i]) || (i > 0 && c.time_s[i] < c.time_s[i - 1])) __builtin_trap();
    }
    if (nan != c.skipped) __builtin_trap();
    const double target = std::isfinite(c.loss[n / 2]) ? c.loss[n / 2] : 0.0;
    if (const auto hit = pf::first_crossing(c, c.smoothed, target))
      if (!std::isfinite(hit->step) || !std::isfinite(hit->time_s)) __builtin_trap();
    const std::string svg = pf::loss_chart_svg(curves, {"report", target});
    if (svg.find("nan") != std::string::npos || svg.find("inf") != std::string::npos) __builtin_trap();
  });
  return 0;
}
