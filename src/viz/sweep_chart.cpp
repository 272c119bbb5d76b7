#include "viz/sweep_chart.hpp"

#include "viz/render.hpp"
#include "viz/style.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace pf {

namespace {

const char* const kPalette[] = {"#4C78A8", "#F28E2B", "#59A14F", "#E15759", "#B07AA1", "#9D7660", "#76B7B2", "#EDC948"};

// The chart's layout (px) and what its x axis and lines show.
struct SweepLayout {
  double pw = 460, ph = 300, left = 70, top = 60, gapx = 90;
  std::set<int> sizes, depths;       // micro-batch sizes and depths D swept
  bool by_depth = false;             // one micro-batch size (times from flags): the depth is the x axis
  std::vector<int> xs;               // x axis values
  std::map<int, const char*> color;  // [D]

  int x_of(const SweepRow& r) const { return by_depth ? r.stages : r.micro_batch_size; }
  const char* line_color(int d) const { return by_depth ? kPalette[0] : color.at(d); }
};

// N = kD micro-batches: solid, dashed, dotted.
const char* dash(int k) { return k == 1 ? "" : k == 2 ? "7 4" : "2 3"; }

SweepLayout sweep_layout(const std::vector<SweepRow>& rows) {
  SweepLayout l;
  for (const SweepRow& r : rows) l.sizes.insert(r.micro_batch_size), l.depths.insert(r.stages);
  l.by_depth = l.sizes.size() == 1;
  l.xs = l.by_depth ? std::vector<int>(l.depths.begin(), l.depths.end())
                    : std::vector<int>(l.sizes.begin(), l.sizes.end());
  int ci = 0;
  for (int d : l.depths) l.color[d] = kPalette[ci++ % 8];
  return l;
}

// One panel's place: its left edge and the value at its top.
struct Panel {
  const SweepLayout& l;
  double x0, ymax;
  double X(int v) const {
    size_t i = std::find(l.xs.begin(), l.xs.end(), v) - l.xs.begin();
    return x0 + (l.xs.size() == 1 ? l.pw / 2 : l.pw * i / (l.xs.size() - 1));
  }
  double Y(double v) const { return l.top + l.ph - l.ph * std::min(v, ymax) / ymax; }
};

// One panel's frame, value axis (tick apart), x axis and labels.
void draw_panel_axes(std::string& o, const Panel& p, const std::string& ylabel, double tick) {
  const SweepLayout& l = p.l;
  const double x0 = p.x0, ymax = p.ymax;
  auto X = [&](int v) { return p.X(v); };
  auto Y = [&](double v) { return p.Y(v); };
  o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#333\"/>\n",
                   x0, l.top, l.pw, l.ph);
  const int ticks = static_cast<int>(std::lround(ymax / tick));
  for (int i = 0; i <= ticks; ++i) {
    const double v = i * tick;
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n",
                     x0, Y(v), x0 + l.pw, Y(v), x0 - 5, Y(v) + 3, tick_text(v, tick));
  }
  for (int v : l.xs)
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", X(v),
                     l.top + l.ph + 14, v);
  o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                   x0 + l.pw / 2, l.top + l.ph + 30, l.by_depth ? "pipeline depth D (stages)" : "micro-batch size");
  o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">{}</text>\n", x0, l.top - 8, ylabel);
}

// One panel: `val` of every row, one line per (D, N / D).
void draw_panel(std::string& o, const SweepLayout& l, const std::vector<SweepRow>& rows, double x0,
                const std::string& ylabel, const std::function<double(const SweepRow&)>& val) {
  double vmax = 0;
  for (const SweepRow& r : rows)
    if (std::isfinite(val(r))) vmax = std::max(vmax, val(r));
  const double tick = nice_tick(vmax > 0 ? vmax : 1, 5);
  const double ymax = tick * std::ceil(std::max(vmax, tick) * (1 + 1e-9) / tick);
  const Panel panel{l, x0, ymax};
  auto X = [&](int v) { return panel.X(v); };
  auto Y = [&](double v) { return panel.Y(v); };
  draw_panel_axes(o, panel, ylabel, tick);
  if (vmax <= 0) {  // nothing to draw: say why rather than a line along the axis
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#666\">all 0 "
                     "(no K-FAC durations given)</text>\n", x0 + l.pw / 2, l.top + l.ph / 2);
    return;
  }
  std::map<std::pair<int, int>, std::vector<const SweepRow*>> lines;
  for (const SweepRow& r : rows) lines[{l.by_depth ? 0 : r.stages, r.micro_batches / r.stages}].push_back(&r);
  for (auto& [key, pts] : lines) {
    std::string path;
    for (const SweepRow* r : pts)
      if (std::isfinite(val(*r)))
        path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(l.x_of(*r)), Y(val(*r)));
    o += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"{}\"/>\n", path,
                     l.line_color(key.first), dash(key.second));
    for (const SweepRow* r : pts)
      if (std::isfinite(val(*r)))
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", X(l.x_of(*r)), Y(val(*r)),
                         l.line_color(key.first));
  }
}

// Legend: a colour per depth (when the x axis is the micro-batch size), a dash per N / D.
void draw_legend(std::string& o, const SweepLayout& l) {
  double x = l.left, y = l.top + l.ph + 62;
  if (!l.by_depth)
    for (int d : l.depths) {
      o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"{}\" stroke-width=\"3\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">D={}</text>\n",
                       x, y, x + 22, y, l.color.at(d), x + 27, y + 4, d);
      x += 80;
    }
  for (int k = 1; k <= 3; ++k) {
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"#333\" stroke-width=\"2\" "
                     "stroke-dasharray=\"{}\"/><text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">N={}D</text>\n",
                     x, y, x + 30, y, dash(k), x + 35, y + 4, k);
    x += 90;
  }
}

}  // namespace

std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title) {
  const SweepLayout l = sweep_layout(rows);
  const double width = l.left + 2 * l.pw + l.gapx + 40, height = l.top + l.ph + 110;
  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                              "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
                              "<text x=\"{:.0f}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}{}</text>\n",
                              width, height, l.left, xml_escape(title),
                              l.by_depth ? fmt::format(", micro-batch size {}", *l.sizes.begin()) : "");
  draw_panel(o, l, rows, l.left, "throughput w/ PipeFisher (sequences/s)",
             [](const SweepRow& r) { return r.throughput_pipefisher; });
  draw_panel(o, l, rows, l.left + l.pw + l.gapx, "(curvature+inversion) / bubble",
             [](const SweepRow& r) { return r.ratio; });
  draw_legend(o, l);
  o += "</svg>\n";
  return o;
}

}  // namespace pf
