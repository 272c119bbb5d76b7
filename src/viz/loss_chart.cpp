#include "viz/loss_chart.hpp"

#include "viz/render.hpp"
#include "viz/smooth.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace pf {

void smooth_curves(std::vector<LossCurve>& curves) {
  for (LossCurve& c : curves) {
    std::vector<double> finite;
    for (double v : c.loss)
      if (std::isfinite(v)) finite.push_back(v);
    const std::vector<double> s = smooth_loss(finite);
    c.smoothing_cutoff = loss_filter_cutoff(finite.size());
    c.smoothed.assign(c.loss.size(), std::numeric_limits<double>::quiet_NaN());
    for (size_t i = 0, k = 0; i < c.loss.size(); ++i)
      if (std::isfinite(c.loss[i])) c.smoothed[i] = s[k++];
  }
}

double last_finite(std::span<const double> values) {
  for (size_t i = values.size(); i-- > 0;)
    if (std::isfinite(values[i])) return values[i];
  return std::numeric_limits<double>::quiet_NaN();
}

std::optional<Crossing> first_crossing(const LossCurve& c, std::span<const double> values, double target) {
  std::optional<size_t> prev;  // the last finite point before i
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) continue;
    if (!(values[i] <= target)) {
      prev = i;
      continue;
    }
    if (!prev) return Crossing{c.step[i], c.time_s[i]};
    const size_t p = *prev;
    const double u = (values[p] - target) / (values[p] - values[i]);  // in (0, 1]
    return Crossing{c.step[p] + u * (c.step[i] - c.step[p]), c.time_s[p] + u * (c.time_s[i] - c.time_s[p])};
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
  if (!std::isfinite(step) || step <= 0) return {lo, hi};
  // By index, at most a few more than `count`: a range of a few ulps must not loop on v + step == v.
  std::vector<double> t;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int k = 0; k <= 3 * std::max(1, count) + 3; ++k) {
    const double v = first + k * step;
    if (v > hi + 1e-9 * step) break;
    t.push_back(std::fabs(v) < 1e-12 * step ? 0.0 : v);
  }
  if (t.empty()) t.push_back(lo);
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

// " (2 steps skipped: gaps)" after a legend entry, when the run skipped steps.
std::string skipped_note(const LossCurve& c) {
  if (c.skipped == 0) return "";
  return fmt::format(" ({} step{} skipped: gaps)", c.skipped, c.skipped == 1 ? "" : "s");
}

// ": reaches 6.36 at step 900 (1234.5 s)" after a legend entry, when the smoothed curve reaches
// the target.
std::string crossing_note(const LossCurve& c, std::optional<double> target) {
  if (!target) return "";
  const auto hit = first_crossing(c, c.smoothed, *target);
  if (!hit) return fmt::format(": does not reach {:g}", *target);
  return fmt::format(": reaches {:g} at step {:.0f} ({:.1f} s)", *target, hit->step, hit->time_s);
}

// One panel: loss (y) against steps or training time (x), mapped to the picture's coordinates.
struct Panel {
  int id = 0;
  bool by_time = false;
  double x0 = 0, top = 0, pw = 0, ph = 0;
  double xhi = 1, ylo = 0, yhi = 1;
  double X(double v) const { return x0 + pw * v / (xhi > 0 ? xhi : 1); }
  double Y(double v) const { return top + ph - ph * (v - ylo) / (yhi - ylo); }
};

std::string panel_axes(const Panel& p, const std::vector<double>& xt, const std::vector<double>& yt,
                       std::optional<double> target) {
  std::string o = fmt::format(
      "<clipPath id=\"plot{}\"><rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\"/></clipPath>\n"
      "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#333\"/>\n",
      p.id, p.x0, p.top, p.pw, p.ph, p.x0, p.top, p.pw, p.ph);
  for (double v : yt)
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:g}</text>\n",
                     p.x0, p.Y(v), p.x0 + p.pw, p.Y(v), p.x0 - 5, p.Y(v) + 3, v);
  for (double v : xt)
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"#e4e4e4\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"10\" text-anchor=\"middle\">{:g}</text>\n",
                     p.X(v), p.top, p.X(v), p.top + p.ph, p.X(v), p.top + p.ph + 14, v);
  o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.pw / 2, p.top + p.ph + 30, p.by_time ? "training time (s)" : "step");
  o += fmt::format("<text transform=\"translate({:.0f},{:.0f}) rotate(-90)\" font-size=\"11\" "
                   "text-anchor=\"middle\">loss (nats)</text>\n",
                   p.x0 - 44, p.top + p.ph / 2);
  o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">training loss vs {}{}</text>\n", p.x0, p.top - 8,
                   p.by_time ? "time" : "steps", target ? fmt::format(" (dashed: target {:g})", *target) : "");
  return o;
}

// The points of a line that a drawing can show: within each pixel column, a piece's first and
// last point and its lowest and highest (in their order), so a 300,000-step log draws as a few
// thousand points (an SVG a renderer reads) and keeps its spikes.
struct ColumnThinner {
  std::vector<size_t> kept;
  void add(size_t i, double column, double y) {
    if (first_ == kNone || column != column_) {
      flush();
      first_ = low_ = high_ = i;
      column_ = column;
      lo_ = hi_ = y;
    }
    if (y < lo_) lo_ = y, low_ = i;
    if (y > hi_) hi_ = y, high_ = i;
    last_ = i;
  }
  void flush() {
    if (first_ == kNone) return;
    size_t pts[] = {first_, std::min(low_, high_), std::max(low_, high_), last_};
    for (size_t i : pts)
      if (kept.empty() || kept.back() != i) kept.push_back(i);
    first_ = kNone;
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t first_ = kNone, low_ = 0, high_ = 0, last_ = 0;
  double column_ = 0, lo_ = 0, hi_ = 0;
};

// A run's raw and smoothed loss as lines, broken where a step was skipped (NaN).
std::string panel_lines(const Panel& p, const LossCurve& c, const char* col) {
  const std::vector<double>& xs = p.by_time ? c.time_s : c.step;
  std::string o;
  auto line = [&](const std::vector<double>& ys, const char* attrs) {
    std::string path;
    size_t piece = 0;  // points in the current piece of the line; a NaN ends it
    auto end_piece = [&] {
      if (piece == 1) path += "l0,0 ";  // a point alone: a zero-length segment, a dot with round caps
      piece = 0;
    };
    ColumnThinner thin;
    const size_t n = std::min(ys.size(), xs.size());
    for (size_t i = 0; i < n; ++i) {
      if (std::isfinite(ys[i])) {
        thin.add(i, std::floor(p.X(xs[i])), ys[i]);
      } else {  // the break stays
        thin.flush();
        thin.kept.push_back(i);
      }
    }
    thin.flush();
    for (size_t i : thin.kept) {
      if (!std::isfinite(ys[i])) {
        end_piece();
        continue;
      }
      path += fmt::format("{}{:.1f},{:.1f} ", piece == 0 ? "M" : "L", p.X(xs[i]), p.Y(ys[i]));
      ++piece;
    }
    end_piece();
    if (!path.empty())
      o += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-linecap=\"round\" {}/>\n", path, col,
                       attrs);
  };
  line(c.loss, "stroke-width=\"1\" stroke-opacity=\"0.5\"");
  line(c.smoothed, "stroke-width=\"2.2\"");
  return o;
}

// A run's validation losses as dots, drawn outside the panel's clip (a dot on its edge stays whole).
std::string panel_dots(const Panel& p, const LossCurve& c, const char* col) {
  std::string o;
  const std::vector<double>& vx = p.by_time ? c.valid_time_s : c.valid_step;
  for (size_t i = 0; i < c.valid_loss.size(); ++i)
    o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\" stroke=\"#fff\"/>\n", p.X(vx[i]),
                     p.Y(c.valid_loss[i]), col);
  return o;
}

// The target as a dashed line, and where each smoothed curve first reaches it (a ring and a
// dotted drop to the axis; the legend gives the numbers, so no label covers a curve).
std::string panel_target(const Panel& p, const std::vector<LossCurve>& curves, double target) {
  std::string o = fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#222\" "
                              "stroke-dasharray=\"6 4\"/>\n",
                              p.x0, p.Y(target), p.x0 + p.pw, p.Y(target));
  for (size_t r = 0; r < curves.size(); ++r) {
    const auto hit = first_crossing(curves[r], curves[r].smoothed, target);
    if (!hit) continue;
    const double cx = p.X(p.by_time ? hit->time_s : hit->step), cy = p.Y(target);
    const char* col = kPalette[r % 8];
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"{}\" "
                     "stroke-dasharray=\"2 3\"/><circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"none\" "
                     "stroke=\"{}\" stroke-width=\"2\"/>\n",
                     cx, cy, cx, p.top + p.ph, col, cx, cy, col);
  }
  return o;
}

std::string loss_panel(const std::vector<LossCurve>& curves, const LossChartOptions& opt, Panel p,
                       const std::vector<double>& yt) {
  Range x;
  for (const LossCurve& c : curves) x.add(p.by_time ? c.time_s : c.step);
  if (!x.ok()) x = {0, 1};
  const std::vector<double> xt = nice_ticks(0, x.hi, 6);
  p.xhi = std::max(x.hi, xt.back());
  std::string o = panel_axes(p, xt, yt, opt.target);
  o += fmt::format("<g clip-path=\"url(#plot{})\">\n", p.id);
  for (size_t r = 0; r < curves.size(); ++r) o += panel_lines(p, curves[r], kPalette[r % 8]);
  if (opt.target) o += panel_target(p, curves, *opt.target);
  o += "</g>\n";
  for (size_t r = 0; r < curves.size(); ++r) o += panel_dots(p, curves[r], kPalette[r % 8]);
  return o;
}

// The smoothing the subtitle names: the cutoff the curves were actually smoothed with (a short
// run's is larger than the paper's 0.05, and a very short one is not smoothed).
std::string smoothing_text(const std::vector<LossCurve>& curves) {
  auto one = [](double cutoff) { return cutoff >= 1 ? std::string("none") : fmt::format("{:.3g}", cutoff); };
  std::set<std::string> cutoffs;
  for (const LossCurve& c : curves) cutoffs.insert(one(c.smoothing_cutoff));
  if (cutoffs.size() <= 1) {
    const std::string c = cutoffs.empty() ? "0.05" : *cutoffs.begin();
    return c == "none" ? "thick: not smoothed (too few steps)"
                       : "thick: smoothed (Butterworth, 3rd order, cutoff " + c + ", forward-backward)";
  }
  std::vector<std::string> each;
  for (const LossCurve& c : curves) each.push_back(c.name + " " + one(c.smoothing_cutoff));
  return fmt::format("thick: smoothed (Butterworth, 3rd order, forward-backward; cutoff {})", fmt::join(each, ", "));
}

constexpr const char* kLegendLine = "thin: training loss per step;";  // is_loss_chart_svg looks for it

}  // namespace

bool is_loss_chart_svg(const std::string& svg) {
  return svg.rfind("<svg ", 0) == 0 && svg.find(kLegendLine) != std::string::npos;
}

std::string loss_chart_svg(const std::vector<LossCurve>& curves, const LossChartOptions& opt) {
  const double pw = 460, ph = 300, left = 70, top = 84, gapx = 90;
  const double width = left + 2 * pw + gapx + 30, height = top + ph + 60 + 18.0 * curves.size();
  Range y;
  for (const LossCurve& c : curves) y.add(c.loss), y.add(c.smoothed), y.add(c.valid_loss);
  if (opt.target) y.add(*opt.target);
  if (!y.ok()) y = {0, 1};
  if (y.hi == y.lo) {  // one value: a band around it, wide enough to tell apart at its magnitude
    const double pad = std::max(0.5, 1e-3 * std::fabs(y.lo));
    y.lo -= pad, y.hi += pad;
  }
  const std::vector<double> yt = nice_ticks(y.lo, y.hi, 6);
  // Room below the lowest point, so that its line is not cut in half by the panel's edge.
  const double ylo = std::min(y.lo - 0.03 * (y.hi - y.lo), yt.front()), yhi = std::max(y.hi, yt.back());
  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                              "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
                              "<text x=\"{:.0f}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}</text>\n"
                              "<text x=\"{:.0f}\" y=\"44\" font-size=\"11\" fill=\"#555\">{} "
                              "{}; dots: validation</text>\n",
                              width, height, left, xml_escape(opt.title), left, kLegendLine,
                              xml_escape(smoothing_text(curves)));
  o += loss_panel(curves, opt, {0, false, left, top, pw, ph, 1, ylo, yhi}, yt);
  o += loss_panel(curves, opt, {1, true, left + pw + gapx, top, pw, ph, 1, ylo, yhi}, yt);
  double ly = top + ph + 52;
  for (size_t r = 0; r < curves.size(); ++r, ly += 18)
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"{}\" stroke-width=\"3\"/>"
                     "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">{}</text>\n",
                     left, ly, left + 24, ly, kPalette[r % 8], left + 30, ly + 4,
                     xml_escape(curves[r].name) + skipped_note(curves[r]) + crossing_note(curves[r], opt.target));
  o += "</svg>\n";
  return o;
}

}  // namespace pf
