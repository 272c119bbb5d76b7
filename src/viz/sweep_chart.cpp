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

std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title) {
  const double pw = 460, ph = 300, left = 70, top = 60, gapx = 90;
  const double width = left + 2 * pw + gapx + 40, height = top + ph + 110;
  std::set<int> bs_set, d_set;
  for (const SweepRow& r : rows) bs_set.insert(r.micro_batch_size), d_set.insert(r.stages);
  // One micro-batch size (times from flags): the depth is the x axis, else a single point.
  const bool by_depth = bs_set.size() == 1;
  const std::vector<int> xs = by_depth ? std::vector<int>(d_set.begin(), d_set.end()) : std::vector<int>(bs_set.begin(), bs_set.end());
  auto x_of = [&](const SweepRow& r) { return by_depth ? r.stages : r.micro_batch_size; };
  const char* palette[] = {"#4C78A8", "#F28E2B", "#59A14F", "#E15759", "#B07AA1", "#9D7660", "#76B7B2", "#EDC948"};
  std::map<int, const char*> color;
  int ci = 0;
  for (int d : d_set) color[d] = palette[ci++ % 8];
  auto line_color = [&](int d) { return by_depth ? palette[0] : color[d]; };
  auto dash = [](int k) { return k == 1 ? "" : k == 2 ? "7 4" : "2 3"; };

  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                              "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
                              "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
                              "<text x=\"{:.0f}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}{}</text>\n",
                              width, height, left, xml_escape(title),
                              by_depth ? fmt::format(", micro-batch size {}", *bs_set.begin()) : "");
  auto panel = [&](double x0, const std::string& ylabel, const std::function<double(const SweepRow&)>& val) {
    double vmax = 0;
    for (const SweepRow& r : rows)
      if (std::isfinite(val(r))) vmax = std::max(vmax, val(r));
    const double tick = nice_tick(vmax > 0 ? vmax : 1, 5);
    const double ymax = tick * std::ceil(std::max(vmax, tick) * (1 + 1e-9) / tick);
    auto X = [&](int v) {
      size_t i = std::find(xs.begin(), xs.end(), v) - xs.begin();
      return x0 + (xs.size() == 1 ? pw / 2 : pw * i / (xs.size() - 1));
    };
    auto Y = [&](double v) { return top + ph - ph * std::min(v, ymax) / ymax; };
    o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#333\"/>\n",
                     x0, top, pw, ph);
    const int ticks = static_cast<int>(std::lround(ymax / tick));
    for (int i = 0; i <= ticks; ++i) {
      const double v = i * tick;
      o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n",
                       x0, Y(v), x0 + pw, Y(v), x0 - 5, Y(v) + 3, tick_text(v, tick));
    }
    for (int v : xs)
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", X(v),
                       top + ph + 14, v);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                     x0 + pw / 2, top + ph + 30, by_depth ? "pipeline depth D (stages)" : "micro-batch size");
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">{}</text>\n", x0, top - 8, ylabel);
    if (vmax <= 0) {  // nothing to draw: say why rather than a line along the axis
      o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#666\">all 0 "
                       "(no K-FAC durations given)</text>\n", x0 + pw / 2, top + ph / 2);
      return;
    }
    std::map<std::pair<int, int>, std::vector<const SweepRow*>> lines;
    for (const SweepRow& r : rows) lines[{by_depth ? 0 : r.stages, r.micro_batches / r.stages}].push_back(&r);
    for (auto& [key, pts] : lines) {
      std::string path;
      for (const SweepRow* r : pts)
        if (std::isfinite(val(*r)))
          path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", X(x_of(*r)), Y(val(*r)));
      o += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"{}\"/>\n", path,
                       line_color(key.first), dash(key.second));
      for (const SweepRow* r : pts)
        if (std::isfinite(val(*r)))
          o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", X(x_of(*r)),
                           Y(val(*r)), line_color(key.first));
    }
  };
  panel(left, "throughput w/ PipeFisher (sequences/s)", [](const SweepRow& r) { return r.throughput_pipefisher; });
  panel(left + pw + gapx, "(curvature+inversion) / bubble", [](const SweepRow& r) { return r.ratio; });
  // Legend.
  double x = left, y = top + ph + 62;
  if (!by_depth)
    for (int d : d_set) {
      o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"{}\" stroke-width=\"3\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">D={}</text>\n",
                       x, y, x + 22, y, color[d], x + 27, y + 4, d);
      x += 80;
    }
  for (int k = 1; k <= 3; ++k) {
    o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"#333\" stroke-width=\"2\" "
                     "stroke-dasharray=\"{}\"/><text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">N={}D</text>\n",
                     x, y, x + 30, y, dash(k), x + 35, y + 4, k);
    x += 90;
  }
  o += "</svg>\n";
  return o;
}

}  // namespace pf
