#include "viz/render.hpp"

#include "core/error.hpp"
#include "viz/style.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace pf {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

namespace {

// A micro-batch number inside a box: at 11 px, else 8 px, else none (never wider than the box).
// DejaVu Sans digits are 0.64 em wide; 2 px of padding each side.
double label_font(double box_width, size_t chars) {
  for (double font : {11.0, 8.0})
    if (0.64 * font * static_cast<double>(chars) + 4 <= box_width) return font;
  return 0;
}

}  // namespace

int timeline_width(const Timeline& tl, const SvgOptions& opt) {
  if (opt.width > 0) return opt.width;
  std::vector<double> d;
  for (const auto& row : tl.per_device)
    for (const TimedAction& t : row)
      if (is_pass(t.action.kind) && t.end > t.start)
        d.push_back(t.end - t.start);
  const int copies = opt.step_starts.empty() ? opt.steps : 1;
  const double span = tl.step_time * copies;
  if (d.empty() || !(span > 0)) return 1200;
  // The lower median: with T_b = 2 T_f, the forward boxes get the 24 px.
  const size_t mid = (d.size() - 1) / 2;
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(mid), d.end());
  return static_cast<int>(std::clamp(std::ceil(span / d[mid] * 24), 1200.0, 16000.0));
}

namespace {

// Where everything of a timeline SVG goes (px), worked out once from the timeline and options.
struct TimelineGeometry {
  double left = 70, top = 58, row_h = 26, lane_h = 0, gap = 6, right = 20;
  double pitch = 0;        // one device row with its send/receive lane and the gap under it
  int axis_w = 0;          // the time axis
  int copies = 1;          // the step drawn this many times (no step_starts)
  double span = 0;         // time on the axis
  double scale = 1;        // px per time unit
  double rows_bottom = 0;  // under the last device row: the time axis
  double width = 0;
  double x(double t) const { return left + t * scale; }
  double row_y(int device) const { return top + device * pitch; }
};

// What the legend lists: the kinds drawn, whether any box is of the up pipeline, and whether any
// K-FAC unit is marked as run in a wait (measured, kfac.placement = adaptive), and whether any box
// names its stage.
struct DrawnKinds {
  std::set<int> kinds;
  bool up = false;
  bool in_wait = false;
  bool staged = false;
};

// The mark under a unit that ran in a wait (a receive's, an all-reduce's): a bar in the send/receive lane.
constexpr std::string_view kInWaitColor = "#E69F00";

std::string timeline_summary(const Timeline& tl, const SvgOptions& opt) {
  if (!opt.summary.empty()) return opt.summary;
  return fmt::format("step {:.2f} {}, utilization {:.1f}%, bubble {:.2f} {} per device", tl.step_time, opt.unit,
                     100 * tl.mean_utilization(), tl.mean_bubble(), opt.unit);
}

TimelineGeometry timeline_geometry(const Timeline& tl, const SvgOptions& opt, const std::string& summary) {
  TimelineGeometry g;
  bool p2p_seen = false;  // a lane under each row for sends and receives, when any has a duration
  for (const auto& row : tl.per_device)
    for (const TimedAction& t : row)
      p2p_seen = p2p_seen || (is_p2p(t.action.kind) && t.end > t.start) || t.in_wait_of >= 0;
  g.lane_h = p2p_seen ? 9 : 0;
  g.pitch = g.row_h + g.lane_h + g.gap;
  g.axis_w = timeline_width(tl, opt);
  g.copies = opt.step_starts.empty() ? opt.steps : 1;
  g.span = tl.step_time * g.copies;
  g.scale = g.span > 0 ? g.axis_w / g.span : 1;
  g.rows_bottom = g.top + static_cast<double>(tl.per_device.size()) * g.pitch;
  // Wide enough for the title too (16 px bold DejaVu Sans: about 9.6 px a character).
  const double title_w = g.left + 9.6 * static_cast<double>(opt.title.size() + summary.size() + 3) + g.right;
  g.width = std::max(g.left + g.axis_w + g.right, title_w);
  return g;
}

// One action's box (a send or receive wait: in the lane under the row, at least 1 px wide), its
// up-pipeline hatching and its micro-batch number; `x0` and `w` in px.
// `looped`: the device holds several stages of a pipeline (interleaved, zb-v), so a box names its
// stage too ("3/s5"), where it fits.
void draw_action(std::string& o, const TimelineGeometry& g, const TimedAction& t, double x0, double w, double y,
                 bool looped, DrawnKinds& drawn) {
  const Action& a = t.action;
  const KindStyle& st = kind_style(a.kind);
  drawn.kinds.insert(static_cast<int>(a.kind));
  if (is_p2p(a.kind)) {
    o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\"><title>{} "
                     "[{:.3f}, {:.3f}]</title></rect>\n",
                     x0, y + g.row_h + 1, std::max(w, 1.0), g.lane_h - 2, st.color, to_token(a), t.start, t.end);
    return;
  }
  o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.0f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\" "
                   "stroke=\"#ffffff\" stroke-width=\"0.6\"><title>{} [{:.3f}, {:.3f}]</title></rect>\n",
                   x0, y, w, g.row_h, st.color, to_token(a), t.start, t.end);
  if (a.pipeline == 1) {
    drawn.up = true;
    o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.0f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"url(#up)\"/>\n", x0,
                     y, w, g.row_h);
  }
  if (a.micro_batch >= 0) {
    std::string label = std::to_string(a.micro_batch);
    if (const std::string staged = fmt::format("{}/s{}", a.micro_batch, a.stage); looped && label_font(w, staged.size()) > 0)
      label = staged, drawn.staged = true;
    if (const double font = label_font(w, label.size()); font > 0)
      o += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" font-size=\"{:.0f}\" text-anchor=\"middle\" "
                       "fill=\"{}\">{}</text>\n", x0 + w / 2, y + g.row_h / 2 + font * 0.36, font, ink_on(st.color), label);
  }
}

// A unit run in the wait of `recv` (measured, adaptive): a bar in the lane under it, named.
void draw_in_wait(std::string& o, const TimelineGeometry& g, const TimedAction& t, const TimedAction& recv, double x0,
                  double w, double y, DrawnKinds& drawn) {
  drawn.in_wait = true;
  o += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\"><title>{} in the "
                   "wait of {}</title></rect>\n",
                   x0, y + g.row_h + 1, std::max(w, 1.0), g.lane_h - 2, kInWaitColor, to_token(t.action),
                   to_token(recv.action));
}

// Whether a device's passes belong to several stages of one pipeline.
bool holds_several_stages(const std::vector<TimedAction>& row) {
  std::set<std::pair<int, int>> stages;
  std::set<int> pipelines;
  for (const TimedAction& t : row)
    if (is_compute(t.action.kind) && t.action.micro_batch >= 0)
      stages.insert({t.action.pipeline, t.action.stage}), pipelines.insert(t.action.pipeline);
  return stages.size() > pipelines.size();
}

// Device rows and their boxes.
DrawnKinds draw_rows(std::string& o, const TimelineGeometry& g, const Timeline& tl) {
  DrawnKinds drawn;
  for (int d = 0; d < static_cast<int>(tl.per_device.size()); ++d) {
    const double y = g.row_y(d);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"end\">device {}</text>\n",
                     g.left - 8, y + g.row_h / 2 + 4, d);
    o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{}\" height=\"{:.0f}\" fill=\"#f4f4f4\"/>\n", g.left, y,
                     g.axis_w, g.row_h + g.lane_h);
    const auto& row = tl.per_device[d];
    const bool looped = holds_several_stages(row);
    for (int k = 0; k < g.copies; ++k)
      for (const TimedAction& t : row) {
        const double x0 = g.x(k * tl.step_time + t.start), w = (t.end - t.start) * g.scale;
        if (w > 0) draw_action(o, g, t, x0, w, y, looped, drawn);
        if (t.in_wait_of >= 0) draw_in_wait(o, g, t, row.at(static_cast<size_t>(t.in_wait_of)), x0, w, y, drawn);
      }
  }
  return drawn;
}

// Step boundaries and labels.
void draw_steps(std::string& o, const TimelineGeometry& g, const Timeline& tl, const SvgOptions& opt) {
  std::vector<double> bounds = opt.step_starts;
  if (opt.step_starts.empty())
    for (int k = 0; k < opt.steps; ++k) bounds.push_back(k * tl.step_time);
  bounds.push_back(g.span);
  for (size_t k = 0; k < bounds.size(); ++k) {
    double x = g.x(bounds[k]);
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"#333\" "
                     "stroke-dasharray=\"4 3\"/>\n", x, g.top - 14, x, g.rows_bottom);
    if (k + 1 < bounds.size())
      o += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"11\" fill=\"#333\">step {}</text>\n", x + 4,
                       g.top - 4, static_cast<int>(k) + opt.first_step);
  }
}

// Time axis: about one tick per 120 px.
void draw_time_axis(std::string& o, const TimelineGeometry& g, const std::string& unit) {
  const double tick = nice_tick(g.span, std::max(2, g.axis_w / 120));
  o += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"#333\"/>\n", g.left,
                   g.rows_bottom, g.left + g.axis_w, g.rows_bottom);
  // Counted, not accumulated: a tick of 0 (an empty step) or below the resolution of huge times
  // must not loop forever.
  const int ticks = tick > 0 ? static_cast<int>(std::min(1000.0, std::floor(g.span * (1 + 1e-9) / tick))) : -1;
  for (int k = 0; k <= ticks; ++k) {
    const double t = k * tick;
    double x = g.x(t);
    o += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"#333\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.0f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n",
                     x, g.rows_bottom, x, g.rows_bottom + 4, x, g.rows_bottom + 15, tick_text(t, tick));
  }
  o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"11\" text-anchor=\"end\">time ({})</text>\n",
                   g.left + g.axis_w, g.rows_bottom + 28, unit);
}

// Legend: the kinds present, in table order, one entry per label, wrapped to the picture's width.
// Returns the y of its last row.
double draw_legend(std::string& o, const TimelineGeometry& g, const DrawnKinds& drawn) {
  double x = g.left, y = g.rows_bottom + 42;
  std::set<std::string_view> labels;
  auto entry = [&](std::string_view color, std::string_view label, bool hatched) {
    const double w = 19 + 7.2 * static_cast<double>(label.size()) + 18;
    if (x > g.left && x + w > g.width - g.right) x = g.left, y += 22;
    o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"14\" fill=\"{}\"/>", x, y, color);
    if (hatched) o += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"14\" height=\"14\" fill=\"url(#up)\"/>", x, y);
    o += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"12\">{}</text>\n", x + 19, y + 11, label);
    x += w;
  };
  for (int k : drawn.kinds) {
    const KindStyle& st = kind_style(static_cast<Kind>(k));
    if (labels.insert(st.label).second) entry(st.color, st.label, false);
  }
  if (drawn.up) entry(kind_style(Kind::F).color, "up pipeline (hatched)", true);
  if (drawn.in_wait) entry(kInWaitColor, "K-FAC unit run in a wait (lane)", false);
  if (drawn.staged) entry("#f4f4f4", "3/s5: micro-batch 3 of stage 5", false);
  return y;
}

// The header (size, hatching pattern, background).
std::string svg_head(double width, double height) {
  std::string head = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
      width, height, width, height);
  head += "<defs><pattern id=\"up\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
          "patternTransform=\"rotate(45)\"><rect width=\"2\" height=\"6\" fill=\"#ffffff\" fill-opacity=\"0.45\"/>"
          "</pattern></defs>\n";
  head += fmt::format("<rect width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", width, height);
  return head;
}

}  // namespace

std::string timeline_svg(const Timeline& tl, const SvgOptions& opt) {
  const std::string summary = timeline_summary(tl, opt);
  const TimelineGeometry g = timeline_geometry(tl, opt, summary);
  // The header is written last: the legend's rows set the height.
  std::string o = fmt::format("<text x=\"{:.0f}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{} — {}</text>\n",
                              g.left, xml_escape(opt.title), xml_escape(summary));
  const DrawnKinds drawn = draw_rows(o, g, tl);
  draw_steps(o, g, tl, opt);
  draw_time_axis(o, g, opt.unit);
  const double legend_bottom = draw_legend(o, g, drawn);
  o += "</svg>\n";
  return svg_head(g.width, legend_bottom + 30) + o;
}

std::string chrome_trace(const Timeline& tl, const std::string& name, double us_per_unit) {
  return chrome_trace({TraceStep{.step = 1, .start = 0, .timeline = &tl}}, name, {}, us_per_unit);
}

namespace {

// The plan's times of `a` from its device's planned row (TraceStep::planned), when it is there.
void add_planned(nlohmann::json& args, const Action& a, const TraceStep& st, size_t device, double us_per_unit) {
  if (!st.planned || device >= st.planned->size()) return;
  for (const TimedAction& p : (*st.planned)[device])
    if (p.action == a) {
      args["planned_start"] = p.start * us_per_unit / 1000;
      args["planned_end"] = p.end * us_per_unit / 1000;
      return;
    }
}

}  // namespace

std::string chrome_trace(const std::vector<TraceStep>& steps, const std::string& name, const LayerNames& layers,
                         double us_per_unit) {
  using nlohmann::json;
  json events = json::array();
  size_t devices = 0;
  for (const TraceStep& st : steps) devices = std::max(devices, st.timeline->per_device.size());
  for (size_t d = 0; d < devices; ++d) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", d}, {"args", {{"name", fmt::format("device {}", d)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", d}, {"args", {{"sort_index", d}}}});
    for (int tid : {0, 1})
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", d}, {"tid", tid},
                        {"args", {{"name", tid == 0 ? "compute" : "communication"}}}});
  }
  // The steps on a track of their own above the devices, and a global marker where each begins.
  const size_t steps_pid = devices;
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", steps_pid}, {"args", {{"name", "steps"}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", steps_pid}, {"args", {{"sort_index", -1}}}});
  for (const TraceStep& st : steps) {
    const Timeline& tl = *st.timeline;
    const std::string label = fmt::format("step {}", st.step);
    events.push_back({{"name", label}, {"cat", "step"}, {"ph", "X"}, {"ts", st.start * us_per_unit},
                      {"dur", tl.step_time * us_per_unit}, {"pid", steps_pid}, {"tid", 0}, {"args", {{"step", st.step}}}});
    events.push_back({{"name", label}, {"cat", "step"}, {"ph", "i"}, {"s", "g"}, {"ts", st.start * us_per_unit},
                      {"pid", steps_pid}, {"tid", 0}});
    for (size_t d = 0; d < tl.per_device.size(); ++d)
      for (const TimedAction& t : tl.per_device[d]) {
        const Action& a = t.action;
        json args = {{"stage", a.stage}, {"pipeline", a.pipeline}, {"step", st.step}, {"action", to_token(a)}};
        if (a.micro_batch >= 0) args["micro_batch"] = a.micro_batch;
        if (a.block >= 0) args["block"] = a.block;
        if (t.in_wait_of >= 0) args["in_wait_of"] = to_token(tl.per_device[d].at(static_cast<size_t>(t.in_wait_of)).action);
        if (t.taps > 0) args["kfac_taps_ms"] = t.taps * us_per_unit / 1000;
        add_planned(args, a, st, d, us_per_unit);
        std::string ev = to_token(a);
        if (a.layer >= 0) {
          args["layer"] = a.layer;
          auto it = layers.find({a.pipeline, a.stage, a.layer});
          if (it != layers.end()) {  // "curvature A bert.encoder.layer.0.attention.self.query"
            args["layer_name"] = it->second;
            ev = fmt::format("{} {}", kind_style(a.kind).label, it->second);
          }
        }
        events.push_back({{"name", ev},
                          {"cat", std::string(kind_style(a.kind).label)},
                          {"ph", "X"},
                          {"ts", (st.start + t.start) * us_per_unit},
                          {"dur", (t.end - t.start) * us_per_unit},
                          {"pid", d},
                          {"tid", is_p2p(a.kind) || is_collective(a.kind) ? 1 : 0},
                          {"args", args}});
      }
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", {{"schedule", name}}}};
  return doc.dump(1) + "\n";
}

namespace {
// A compute or collective action's text label: its glyph and micro-batch ("F12").
std::string text_label(const Action& a) {
  std::string label(1, kind_style(a.kind).glyph);
  if (a.micro_batch >= 0) label += std::to_string(a.micro_batch);
  return label;
}

// Columns enough for every labelled pass's whole label (F10, not F-); at most kMaxTextColumns,
// past which a short pass shows its glyph only.
constexpr int kMaxTextColumns = 1000;
int text_columns(const Timeline& tl, int columns) {
  if (tl.step_time <= 0) return columns;
  double need = columns;
  for (const auto& device : tl.per_device)
    for (const TimedAction& t : device)
      if (is_compute(t.action.kind) && t.action.micro_batch >= 0 && t.end > t.start)
        need = std::max(need, static_cast<double>(text_label(t.action).size()) * tl.step_time / (t.end - t.start));
  return static_cast<int>(std::min<double>(kMaxTextColumns, std::max<double>(columns, std::ceil(need))));
}
}  // namespace

std::string timeline_text(const Timeline& tl, int min_columns) {
  std::string o;
  const int columns = text_columns(tl, min_columns);
  const double scale = tl.step_time > 0 ? columns / tl.step_time : 1;
  for (size_t d = 0; d < tl.per_device.size(); ++d) {
    std::string row(columns, '.');
    for (const TimedAction& t : tl.per_device[d]) {
      if (!is_compute(t.action.kind) && !is_collective(t.action.kind)) continue;
      int c0 = static_cast<int>(std::lround(t.start * scale)), c1 = static_cast<int>(std::lround(t.end * scale));
      c1 = std::min(std::max(c1, c0 + 1), columns);
      if (c0 >= columns) continue;
      std::string label = text_label(t.action);
      if (static_cast<int>(label.size()) > c1 - c0) label.resize(1);
      for (int c = c0; c < c1; ++c) row[c] = c - c0 < static_cast<int>(label.size()) ? label[c - c0] : '-';
    }
    o += fmt::format("{:>4} |{}|\n", d, row);
  }
  return o;
}

}  // namespace pf
