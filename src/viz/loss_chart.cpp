#include "viz/loss_chart.hpp"

#include "viz/render.hpp"
#include "viz/smooth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pf {

void smooth_curves(std::vector<LossCurve>& curves) {
  const IirFilter f = paper_loss_filter();
  for (LossCurve& c : curves) c.smoothed = filtfilt(f, c.loss);
}

std::optional<Crossing> first_crossing(const LossCurve& c, std::span<const double> values, double target) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(values[i] <= target)) continue;
    if (i == 0) return Crossing{c.step[0], c.time_s[0]};
    const double u = (values[i - 1] - target) / (values[i - 1] - values[i]);  // in (0, 1]
    return Crossing{c.step[i - 1] + u * (c.step[i] - c.step[i - 1]), c.time_s[i - 1] + u * (c.time_s[i] - c.time_s[i - 1])};
  }
  return std::nullopt;
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, count);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + 1e-9 * step; v += step) t.push_back(std::fabs(v) < 1e-12 * step ? 0.0 : v);
  return t;
}

namespace {

const char* kPalette[] = {"#4C78A8", "#E15759", "#59A14F", "#F28E2B", "#B07AA1", "#76B7B2", "#9D7660", "#EDC948"};

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  void add(std::span<const double> vs) {
    for (double v : vs) add(v);
  }
  bool ok() const { return lo <= hi; }
};

}  // namespace

std::string loss_chart_svg(const std::vector<LossCurve>& curves, const LossChartOptions& opt) {
  const double pw = 460, ph = 300, left = 70, top = 84, gapx = 90;
  const double width = left + 2 * pw + gapx + 30, height = top + ph + 60 + 18.0 * curves.size();
  Range y;
  for (const LossCurve& c : curves) y.add(c.loss), y.add(c.smoothed), y.add(c.valid_loss);
  if (opt.target) y.add(*opt.target);
  if (!y.ok()) y = {0, 1};
  if (y.hi == y.lo) y.lo -= 0.5, y.hi += 0.5;
  const std::vector<double> yt = nice_ticks(y.lo, y.hi, 6);
  const double ylo = std::min(y.lo, yt.front()), yhi = std::max(y.hi, yt.back());
  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                              "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
                              "<text x=\"{:.0f}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}</text>\n"
                              "<text x=\"{:.0f}\" y=\"44\" font-size=\"11\" fill=\"#555\">thin: training loss per step; "
                              "thick: smoothed (Butterworth, 3rd order, cutoff 0.05, forward-backward); dots: "
                              "validation</text>\n",
                              width, height, left, xml_escape(opt.title), left);
  auto panel = [&](int id, double x0, bool by_time) {
    Range x;
    for (const LossCurve& c : curves) x.add(by_time ? c.time_s : c.step);
    if (!x.ok()) x = {0, 1};
    const std::vector<double> xt = nice_ticks(0, x.hi, 6);
    const double xhi = std::max(x.hi, xt.back());
    auto X = [&](double v) { return x0 + pw * v / (xhi > 0 ? xhi : 1); };
    auto Y = [&](double v) { return top + ph - ph * (v - ylo) / (yhi - ylo); };
    o += fmt::format("<clipPath id=\"plot{}\"><rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\"/></clipPath>\n",
                     id, x0, top, pw, ph);
    o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#333\"/>\n",
                     x0, top, pw, ph);
    for (double v : yt)
      o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:g}</text>\n",
                       x0, Y(v), x0 + pw, Y(v), x0 - 5, Y(v) + 3, v);
    for (double v : xt)
      o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"#e4e4e4\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"10\" text-anchor=\"middle\">{:g}</text>\n",
                       X(v), top, X(v), top + ph, X(v), top + ph + 14, v);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", x0 + pw / 2,
                     top + ph + 30, by_time ? "training time (s)" : "step");
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">training loss vs {}</text>\n", x0, top - 8,
                     by_time ? "time" : "steps");
    o += fmt::format("<g clip-path=\"url(#plot{})\">\n", id);
    for (size_t r = 0; r < curves.size(); ++r) {
      const LossCurve& c = curves[r];
      const char* col = kPalette[r % 8];
      const std::vector<double>& xs = by_time ? c.time_s : c.step;
      auto line = [&](const std::vector<double>& ys, const char* attrs) {
        std::string path;
        for (size_t i = 0; i < ys.size() && i < xs.size(); ++i)
          if (std::isfinite(ys[i])) path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(xs[i]), Y(ys[i]));
        if (!path.empty()) o += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" {}/>\n", path, col, attrs);
      };
      line(c.loss, "stroke-width=\"0.8\" stroke-opacity=\"0.35\"");
      line(c.smoothed, "stroke-width=\"2.2\"");
      const std::vector<double>& vx = by_time ? c.valid_time_s : c.valid_step;
      for (size_t i = 0; i < c.valid_loss.size(); ++i)
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\" stroke=\"#fff\"/>\n", X(vx[i]),
                         Y(c.valid_loss[i]), col);
    }
    if (opt.target) {
      o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#222\" "
                       "stroke-dasharray=\"6 4\"/>\n",
                       x0, Y(*opt.target), x0 + pw, Y(*opt.target));
      for (size_t r = 0; r < curves.size(); ++r) {
        const auto hit = first_crossing(curves[r], curves[r].smoothed, *opt.target);
        if (!hit) continue;
        const double cx = X(by_time ? hit->time_s : hit->step), cy = Y(*opt.target);
        // The label reads away from the nearer edge, so that the panel's clip never cuts it.
        const bool right_half = cx > x0 + pw / 2;
        o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"{}\" "
                         "stroke-dasharray=\"2 3\"/><circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"none\" "
                         "stroke=\"{}\" stroke-width=\"2\"/><text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" "
                         "text-anchor=\"{}\" fill=\"{}\">{}</text>\n",
                         cx, cy, cx, top + ph, kPalette[r % 8], cx, cy, kPalette[r % 8], right_half ? cx - 7 : cx + 7,
                         cy - 8 - 12.0 * r, right_half ? "end" : "start", kPalette[r % 8],
                         by_time ? fmt::format("{:.1f} s", hit->time_s) : fmt::format("step {:.0f}", hit->step));
      }
    }
    o += "</g>\n";
    if (opt.target)
      o += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">target {:g}</text>\n",
                       x0 + pw - 4, Y(*opt.target) + 13, *opt.target);
  };
  panel(0, left, false);
  panel(1, left + pw + gapx, true);
  double ly = top + ph + 52;
  for (size_t r = 0; r < curves.size(); ++r, ly += 18)
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"{}\" stroke-width=\"3\"/>"
                     "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">{}</text>\n",
                     left, ly, left + 24, ly, kPalette[r % 8], left + 30, ly + 4, xml_escape(curves[r].name));
  o += "</svg>\n";
  return o;
}

}  // namespace pf
