// Renderings (SVG timeline, Chrome trace, terminal text, sweep table and chart).
#include "core/error.hpp"
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "sim/sweep.hpp"
#include "core/files.hpp"
#include "viz/render.hpp"
#include "viz/style.hpp"
#include "viz/sweep_chart.hpp"
#include "../support/scratch.hpp"

#include <cctype>
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <string_view>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace pf {
namespace {

CostModel uniform(double tf, double tb) {
  CostModel c;
  c.stages[0].forward = tf;
  c.stages[0].backward = tb;
  return c;
}

// One step at `width` px (0: automatic).
SvgOptions options(const std::string& title, int width) {
  SvgOptions o;
  o.title = title;
  o.steps = 1;
  o.width = width;
  return o;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Style, EveryKindHasAColourAndDistinctPipelineColours) {
  std::set<std::string_view> colors;
  for (int k = 0; k < kNumKinds; ++k) {
    const KindStyle& s = kind_style(static_cast<Kind>(k));
    EXPECT_EQ(s.color.size(), 7u);
    EXPECT_FALSE(s.label.empty());
    colors.insert(s.color);
  }
  // F, B, I, W, the K-FAC kinds and sync-grad are told apart by colour.
  for (Kind a : {Kind::F, Kind::B, Kind::I, Kind::W, Kind::CURV_A, Kind::INV_A, Kind::PREC, Kind::SYNC_CURV, Kind::ALLREDUCE})
    for (Kind b : {Kind::F, Kind::B, Kind::I, Kind::W, Kind::CURV_A, Kind::INV_A, Kind::PREC, Kind::SYNC_CURV, Kind::ALLREDUCE})
      if (a != b) {
        EXPECT_NE(kind_style(a).color, kind_style(b).color);
      }
}

// CIELAB (D65) of a "#rrggbb" colour, for the colour distance a reader sees.
std::array<double, 3> lab(std::string_view hex) {
  double rgb[3];
  for (int c = 0; c < 3; ++c) {
    const double v = std::stoi(std::string(hex.substr(1 + 2 * c, 2)), nullptr, 16) / 255.0;
    rgb[c] = v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4);
  }
  const double x = (0.4124 * rgb[0] + 0.3576 * rgb[1] + 0.1805 * rgb[2]) / 0.95047,
               y = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2],
               z = (0.0193 * rgb[0] + 0.1192 * rgb[1] + 0.9505 * rgb[2]) / 1.08883;
  auto f = [](double t) { return t > 0.008856 ? std::cbrt(t) : 7.787 * t + 16.0 / 116; };
  return {116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))};
}

// Kinds with different legend entries are told apart at a glance: CIE76 distance >= 15 (about
// twice the "just noticeable" 2.3 for small boxes). The A/B pairs of curvature and inversion,
// and sync-grad against optimizer and the waiting grey, were once under 10.
TEST(Style, KindsWithDifferentLabelsHaveDistinctColours) {
  for (int a = 0; a < kNumKinds; ++a)
    for (int b = a + 1; b < kNumKinds; ++b) {
      const KindStyle &x = kind_style(static_cast<Kind>(a)), &y = kind_style(static_cast<Kind>(b));
      if (x.label == y.label) continue;
      const auto p = lab(x.color), q = lab(y.color);
      const double distance = std::hypot(p[0] - q[0], p[1] - q[1], p[2] - q[2]);
      EXPECT_GE(distance, 15) << x.label << " " << x.color << " vs " << y.label << " " << y.color;
    }
}

// A box's label: dark on light fills, white on dark ones.
TEST(Style, LabelInkContrastsWithTheFill) {
  EXPECT_EQ(ink_on("#ffffff"), "#222222");
  EXPECT_EQ(ink_on("#000000"), "#ffffff");
  EXPECT_EQ(ink_on(kind_style(Kind::CURV_B).color), "#222222");    // yellow
  EXPECT_EQ(ink_on(kind_style(Kind::ALLREDUCE).color), "#ffffff");  // navy
}

TEST(Svg, OneBoxPerActionPerStepWithTitleAndLegend) {
  Schedule s = make_chimera(4, 8);
  Timeline tl = simulate(s, uniform(1, 2));
  std::string svg = timeline_svg(tl, {.title = "chimera D=4 N=8", .unit = "ms", .steps = 2, .width = 1200, .step_starts = {}, .first_step = 1, .summary = {}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<title>"), 2 * s.num_actions());
  EXPECT_EQ(count(svg, "<title>0F4p0"), 0u);  // pipeline 0 tokens carry no suffix
  EXPECT_EQ(count(svg, "<title>0F0 "), 2u);
  EXPECT_NE(svg.find(fmt::format("utilization {:.1f}%", 100 * tl.mean_utilization())), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"4 3\""), 3u);  // boundaries of two steps
  for (const char* label : {">forward<", ">backward<", ">up pipeline (hatched)<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(svg.find(">curvature A<"), std::string::npos);  // legend lists the kinds present
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

TEST(Svg, KfacKindsGetTheirColours) {
  Schedule s = make_gpipe(2, 2);
  s.per_device[0].push_back({Kind::CURV_A, 0, 0, 1, 0});
  s.per_device[0].push_back({Kind::INV_A, 0, 0, -1, 0});
  CostModel c = uniform(1, 2);
  c.stages[0].curvature = 2;
  c.stages[0].inversion = 2;
  std::string svg = timeline_svg(simulate(s, c), {.title = "k", .unit = "ms", .steps = 1, .width = 1200, .step_starts = {}, .first_step = 1, .summary = {}});
  EXPECT_NE(svg.find(std::string("fill=\"") + std::string(kind_style(Kind::CURV_A).color)), std::string::npos);
  EXPECT_NE(svg.find(">inversion A<"), std::string::npos);
}

TEST(Trace, ChromeEventsMatchTheTimeline) {
  Schedule s = make_1f1b(3, 4);
  Timeline tl = simulate(s, uniform(1.5, 2.5));
  auto j = nlohmann::json::parse(chrome_trace(tl, "1f1b"));
  size_t complete = 0, meta = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      ++meta;
      continue;
    }
    if (e.value("cat", "") == "step") continue;  // the step's marker
    ++complete;
    const int d = e["pid"];
    bool found = false;
    for (const TimedAction& t : tl.per_device[d])
      if (to_token(t.action) == e["name"]) {
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), t.start * 1000);
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), (t.end - t.start) * 1000);
        found = true;
      }
    EXPECT_TRUE(found) << e.dump();
  }
  EXPECT_EQ(meta, 3u * 4 + 2);  // per device: its name, its order, its two threads' names; the steps track
  EXPECT_EQ(complete, s.num_actions());
}

TEST(Trace, ComputeAndCommunicationOnNamedThreads) {
  Schedule s = make_gpipe(2, 2);
  s.per_device[0].push_back(act(Kind::ALLREDUCE, 0, -1));
  s.per_device[1].push_back(act(Kind::ALLREDUCE, 1, -1));
  auto j = nlohmann::json::parse(chrome_trace(simulate(s, uniform(1, 2)), "gpipe"));
  std::map<std::pair<int, int>, std::string> threads;
  int on_comm = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    const bool comm = e["cat"] == std::string(kind_style(Kind::ALLREDUCE).label);
    EXPECT_EQ(e["tid"].get<int>(), comm ? 1 : 0) << e.dump();
    on_comm += comm;
  }
  EXPECT_EQ(on_comm, 2);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(threads[std::make_pair(d, 0)], "compute");
    EXPECT_EQ(threads[std::make_pair(d, 1)], "communication");
  }
}

TEST(Svg, MeasuredStepsKeepTheirNumbers) {
  Timeline tl = simulate(make_1f1b(2, 2), uniform(1, 2));
  const std::string svg = timeline_svg(tl, {.title = "measured", .unit = "ms", .steps = 1, .width = 600, .step_starts = {}, .first_step = 8, .summary = {}});
  EXPECT_NE(svg.find(">step 8<"), std::string::npos);
  EXPECT_EQ(svg.find(">step 1<"), std::string::npos);
}

TEST(Text, TerminalRowsShowKindsAndIdle) {
  // 1F1B, D = 2, N = 1, T_f = T_b = 1: step 4, one column per time unit.
  Timeline tl = simulate(make_1f1b(2, 1), uniform(1, 1));
  EXPECT_EQ(timeline_text(tl, 8), "   0 |F0....B0|\n   1 |..F0B0..|\n");
  EXPECT_EQ(timeline_text(tl, 4), timeline_text(tl, 8));  // widened until every label fits
}

// Micro-batches from 10 on keep their numbers: every pass is wide enough for its label.
TEST(Text, TwoDigitMicroBatchesAreWritten) {
  Timeline tl = simulate(make_1f1b(2, 12), uniform(1, 1));
  const std::string text = timeline_text(tl);
  for (int mb = 0; mb < 12; ++mb)
    for (const char* kind : {"F", "B"}) {
      const std::string label = kind + std::to_string(mb);
      size_t count = 0;
      for (size_t at = text.find(label); at != std::string::npos; at = text.find(label, at + 1))
        count += at + label.size() >= text.size() || !std::isdigit(static_cast<unsigned char>(text[at + label.size()]));
      EXPECT_EQ(count, 2u) << label << "\n" << text;  // once on each device
    }
}

TEST(Files, AtomicWriteLeavesNoTemporary) {
  const auto dir = pf_test::scratch_dir("test_viz");
  auto path = (dir / "out.svg").string();
  write_output({path, "--svg", true}, "hello");
  std::ifstream f(path);
  std::string body((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(body, "hello");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
  EXPECT_THROW(write_output({"/nonexistent-dir/x.svg", "--svg", true}, "x"), UsageError);
}

TEST(Sweep, RowsFollowTheClosedForms) {
  Profile p;
  p.micro_batch_size = 8;
  p.cost.stages[0] = StageCost{};
  p.cost.stages[0].forward = 1;
  p.cost.stages[0].backward = 2;
  p.cost.stages[0].curvature = 0.5;
  p.cost.stages[0].inversion = 3;
  p.cost.stages[0].precondition = 0.25;
  p.memory = {StageMemory{10, 3, 2, 1, 7}};
  SweepSpec spec;
  spec.schedule = "1f1b";
  spec.stages = {2, 4};
  std::vector<SweepRow> rows = run_sweep(spec, {p});
  ASSERT_EQ(rows.size(), 6u);
  const SweepRow& r = rows[3];  // D = 4, N = 4
  EXPECT_EQ(r.stages, 4);
  EXPECT_EQ(r.micro_batches, 4);
  EXPECT_DOUBLE_EQ(r.t_pipe, 7 * 3);
  EXPECT_DOUBLE_EQ(r.t_bubble, 3 * 3);
  EXPECT_DOUBLE_EQ(r.t_prec, 0.25);
  EXPECT_DOUBLE_EQ(r.t_curv_inv, 4 * 0.5 + 3);
  EXPECT_DOUBLE_EQ(r.ratio, 5.0 / 9);
  EXPECT_DOUBLE_EQ(r.throughput_pipe, 32 / 21.0 * 1000);
  EXPECT_DOUBLE_EQ(r.throughput_pipefisher, 32 / 21.25 * 1000);
  EXPECT_DOUBLE_EQ(r.throughput_kfac, 32 / 26.25 * 1000);
  EXPECT_DOUBLE_EQ(r.throughput_kfac_skip, 32 / 26.25 * 1000);  // ratio < 1: refresh every step
  EXPECT_DOUBLE_EQ(r.m_pipe, 20 + 4 * 3 + 2);
  EXPECT_FALSE(r.recompute);
  {
    // R: every backward repeats its forward (T_b' = 3), one micro-batch's activations per stage.
    SweepSpec rs = spec;
    rs.recompute = true;
    const SweepRow q = run_sweep(rs, {p})[3];
    EXPECT_TRUE(q.recompute);
    EXPECT_DOUBLE_EQ(q.t_pipe, 7 * (1 + 3));
    EXPECT_DOUBLE_EQ(q.t_bubble, 3 * (2 * 1 + 2));  // T_pipe - N (2 T_f + T_b)
    EXPECT_DOUBLE_EQ(q.ratio, 5.0 / 12);            // a larger bubble: curvature fits sooner
    EXPECT_DOUBLE_EQ(q.m_pipe, 20 + 3 + 2);         // N M_act -> M_act
    EXPECT_DOUBLE_EQ(q.m_kfac, r.m_kfac);           // K-FAC's memory stays (the bottleneck with R)
    EXPECT_LT(q.throughput_pipefisher, r.throughput_pipefisher);
  }
  // Chimera skips odd depths; its stage's copies share T_inv and T_prec (the paper's per stage):
  // at D = N = 4 a device runs 4 micro-batches' curvature and one stage's inversion.
  spec.schedule = "chimera";
  spec.stages = {3, 4};
  const std::vector<SweepRow> ch = run_sweep(spec, {p});
  EXPECT_EQ(ch.size(), 3u);
  EXPECT_DOUBLE_EQ(ch[0].t_prec, 0.25);
  EXPECT_DOUBLE_EQ(ch[0].t_curv_inv, 4 * 0.5 + 3);
  EXPECT_DOUBLE_EQ(ch[0].t_pipe, 4 * 1 + 6 * 2);  // C_f = D, C_b = 2D - 2 at T_b = 2 T_f
  std::string csv = sweep_csv(rows);
  EXPECT_EQ(count(csv, "\n"), 7u);
  EXPECT_EQ(csv.rfind("schedule,micro_batch_size,stages,micro_batches,t_pipe", 0), 0u);
  // One micro-batch size: over the depth, one line per N = kD with a point per depth.
  std::string svg = sweep_svg(rows, "t");
  EXPECT_EQ(count(svg, "<path"), 2u * 3);
  EXPECT_EQ(count(svg, "<circle"), 2u * 6);
  EXPECT_NE(svg.find("pipeline depth D"), std::string::npos);
  // Two micro-batch sizes: over the micro-batch size, one line per (D, N).
  Profile q = p;
  q.micro_batch_size = 16;
  std::vector<SweepRow> two = run_sweep(spec, {p, q});
  EXPECT_EQ(count(sweep_svg(two, "t"), "<path"), 2u * 3);  // chimera: one depth (4) x 3 multiples
}

// Parses the numbers of the y-axis tick labels of the sweep chart's panels / the x-axis ones of
// a timeline: "<text ... font-size=\"10\" text-anchor=\"(end|middle)\">NUMBER</text>".
std::vector<std::string> tick_labels(const std::string& svg, const std::string& anchor) {
  std::vector<std::string> out;
  const std::string open = "font-size=\"10\" text-anchor=\"" + anchor + "\">";
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    const size_t b = p + open.size(), e = svg.find('<', b);
    out.push_back(svg.substr(b, e - b));
  }
  return out;
}

bool is_nice(double tick) {  // 1, 2 or 5 times a power of ten
  const double m = tick / std::pow(10.0, std::floor(std::log10(tick) + 1e-12));
  return std::abs(m - 1) < 1e-9 || std::abs(m - 2) < 1e-9 || std::abs(m - 5) < 1e-9;
}

TEST(Ticks, NiceSpacingAndShortLabels) {
  // Property over ranges from 1e-6 to 1e9: a 1/2/5 x 10^k spacing giving between target/2.5 and
  // target ticks (the next nice value up is at most 2.5x).
  for (double range = 1.3e-6; range < 1e9; range *= 1.37)
    for (int target : {3, 5, 10}) {
      const double t = nice_tick(range, target);
      ASSERT_TRUE(is_nice(t)) << range << " " << target << " " << t;
      EXPECT_GE(t * (1 + 1e-9), range / target) << range;
      EXPECT_LT(t, 2.5 * range / target * (1 + 1e-9)) << range;
    }
  EXPECT_EQ(nice_tick(0, 5), 0);
  EXPECT_EQ(nice_tick(INFINITY, 5), 0);
  EXPECT_EQ(tick_text(3 * 0.1, 0.1), "0.3");
  EXPECT_EQ(tick_text(40, 20), "40");
  EXPECT_EQ(tick_text(0.25 * 3, 0.05), "0.75");
  // A timeline with an odd step: every axis label is k * tick, printed without float noise.
  Timeline tl = simulate(make_1f1b(3, 5), uniform(0.37, 0.71));
  const std::vector<std::string> xs = tick_labels(timeline_svg(tl, options("t", 0)), "middle");
  ASSERT_GE(xs.size(), 3u);
  const double tick = std::stod(xs[1]) - std::stod(xs[0]);
  EXPECT_TRUE(is_nice(tick)) << tick;
  for (size_t k = 0; k < xs.size(); ++k) {
    EXPECT_NEAR(std::stod(xs[k]), k * tick, 1e-9) << xs[k];
    EXPECT_LE(xs[k].size(), 6u) << xs[k];
  }
  // The sweep chart's y axes likewise.
  Profile p;
  p.micro_batch_size = 8;
  p.cost.stages[0].forward = 0.37;
  p.cost.stages[0].backward = 0.71;
  p.cost.stages[0].curvature = 0.13;
  p.cost.stages[0].inversion = 1.7;
  p.memory = {StageMemory{}};
  SweepSpec spec;
  spec.schedule = "1f1b";
  spec.stages = {2, 4, 8};
  const std::vector<std::string> ys = tick_labels(sweep_svg(run_sweep(spec, {p}), "t"), "end");
  ASSERT_GE(ys.size(), 6u);
  for (const std::string& y : ys) EXPECT_LE(y.size(), 7u) << y;
  EXPECT_TRUE(is_nice(std::stod(ys[1]) - std::stod(ys[0]))) << ys[1];
}

TEST(Sweep, AllZeroPanelSaysSoInsteadOfALine) {
  Profile p;
  p.micro_batch_size = 8;
  p.cost.stages[0].forward = 1;
  p.cost.stages[0].backward = 2;  // no K-FAC durations: every ratio is 0
  p.memory = {StageMemory{}};
  SweepSpec spec;
  spec.schedule = "1f1b";
  spec.stages = {2, 4};
  const std::string svg = sweep_svg(run_sweep(spec, {p}), "t");
  EXPECT_NE(svg.find("all 0 (no K-FAC durations given)"), std::string::npos);
  EXPECT_EQ(count(svg, "<path"), 3u);  // the throughput panel's lines only
}

// Box widths and label fonts of a timeline SVG, in order: (box width, label font or 0, label).
struct Box {
  double width = 0, font = 0;
  std::string label;
};
std::vector<Box> boxes(const std::string& svg) {
  std::vector<Box> out;
  size_t p = 0;
  while ((p = svg.find("<rect x=", p)) != std::string::npos) {
    const size_t end = svg.find('\n', p);
    const std::string line = svg.substr(p, end - p);
    p = end;
    if (line.find("<title>") == std::string::npos) continue;  // backgrounds, hatching, legend
    Box b;
    const size_t w = line.find("width=\"") + 7;
    b.width = std::stod(line.substr(w));
    const size_t next = svg.find("<text x=", end);
    const size_t next_rect = svg.find("<rect x=", end);
    // A box's label: its text element, in the ink ink_on gives its fill.
    const size_t ink = svg.find("text-anchor=\"middle\" fill=\"#", next);
    if (next != std::string::npos && next < next_rect && ink < svg.find('\n', next)) {
      const size_t f = svg.find("font-size=\"", next) + 11;
      b.font = std::stod(svg.substr(f));
      const size_t lb = svg.find("\">", ink) + 2;
      b.label = svg.substr(lb, svg.find('<', lb) - lb);
    }
    out.push_back(b);
  }
  return out;
}

TEST(Svg, LabelsOnlyWhereTheBoxHoldsThem) {
  // 1F1B with 64 micro-batches on 4 devices at a fixed 1200 px: boxes of about 5 px (no label)
  // and, with T_b = 20 T_f, wide backward boxes (labels "0" .. "63").
  Timeline tl = simulate(make_1f1b(4, 64), uniform(0.1, 2));
  const std::vector<Box> bs = boxes(timeline_svg(tl, options("t", 1200)));
  int labelled = 0, bare = 0;
  for (const Box& b : bs) {
    if (b.font > 0) {
      ++labelled;
      EXPECT_LE(0.64 * b.font * static_cast<double>(b.label.size()) + 4, b.width + 1e-9) << b.label;
    } else {
      ++bare;
      EXPECT_LT(b.width, 0.64 * 8 * 1 + 4 + 1e-9);  // not even one digit at 8 px fits
    }
  }
  EXPECT_GT(labelled, 0);
  EXPECT_GT(bare, 0);
}

TEST(Svg, LongPlansWidenInsteadOfSlivers) {
  // 8 devices, 96 micro-batches: at the old fixed 1200 px a forward box was ~2 px wide.
  Timeline tl = simulate(make_1f1b(8, 96), uniform(1, 2));
  const SvgOptions o = options("long", 0);
  const int w = timeline_width(tl, o);
  EXPECT_GE(w / tl.step_time * 1.0, 24 - 1e-9);  // the lower median box (a forward, 1 ms) gets 24 px
  EXPECT_LE(w, 16000);
  const std::string svg = timeline_svg(tl, o);
  EXPECT_NE(svg.find(fmt::format("width=\"{}\" height=", w + 90)), std::string::npos);  // left 70 + right 20
  // A short plan keeps the usual width.
  EXPECT_EQ(timeline_width(simulate(make_1f1b(2, 2), uniform(1, 2)), o), 1200);
}

TEST(Svg, LegendWrapsWithinThePicture) {
  // Every K-FAC kind on a narrow picture: the legend takes several rows, none past the right edge.
  Schedule s = make_gpipe(2, 2);
  for (Kind k : {Kind::CURV_A, Kind::CURV_B, Kind::SYNC_CURV, Kind::INV_A, Kind::INV_B, Kind::PREC, Kind::BCAST_INV_A,
                 Kind::BCAST_INV_B, Kind::ALLREDUCE, Kind::OPT})
    s.per_device[0].push_back({k, 0, 0, k == Kind::CURV_A || k == Kind::CURV_B ? 1 : -1, 0});
  CostModel c = uniform(1, 2);
  c.stages[0].curvature = c.stages[0].inversion = c.stages[0].precondition = c.stages[0].optimizer = 1;
  c.allreduce_alpha = 1;
  const std::string svg = timeline_svg(simulate(s, c), options("k", 400));
  const double width = std::stod(svg.substr(svg.find("width=\"") + 7));  // the title may widen it
  std::set<double> rows;
  for (size_t p = svg.find("width=\"14\" height=\"14\""); p != std::string::npos; p = svg.find("width=\"14\" height=\"14\"", p + 1)) {
    const size_t line = svg.rfind("<rect x=\"", p);
    const double x = std::stod(svg.substr(line + 9));
    const double y = std::stod(svg.substr(svg.find("y=\"", line) + 3));
    rows.insert(y);
    EXPECT_LT(x, width - 20) << x;
  }
  EXPECT_GE(rows.size(), 2u);
  // The picture is tall enough for the last row.
  const double height = std::stod(svg.substr(svg.find("height=\"") + 8));
  EXPECT_GE(height, *rows.rbegin() + 14);
}

TEST(Svg, SendsAndReceivesInTheirOwnLane) {
  // The lowered 1F1B with a message delay: every send/recv with a duration is a dark bar of at
  // least 1 px in the lane under its device's row, listed in the legend.
  Schedule s = lower_communication(make_1f1b(2, 4), {});
  CostModel c = uniform(1, 2);
  c.p2p_latency = 0.3;
  Timeline tl = simulate(s, c);
  int p2p = 0;
  for (const auto& row : tl.per_device)
    for (const TimedAction& t : row) p2p += is_p2p(t.action.kind) && t.end > t.start;
  ASSERT_GT(p2p, 0);
  const std::string svg = timeline_svg(tl, options("p2p", 0));
  EXPECT_EQ(count(svg, "height=\"7\" fill=\"" + std::string(kind_style(Kind::RECV_F).color)) +
                count(svg, "height=\"7\" fill=\"" + std::string(kind_style(Kind::SEND_F).color)),
            static_cast<size_t>(p2p));
  EXPECT_NE(svg.find(">recv (waiting)<"), std::string::npos);
}

TEST(Trace, OneFileForSeveralStepsWithMarkersAndLayerNames) {
  Schedule s = make_gpipe(2, 2);
  s.per_device[0].push_back({Kind::CURV_A, 0, 0, 1, 2});
  CostModel c = uniform(1, 2);
  c.stages[0].curvature = 1;
  Timeline tl = simulate(s, c);
  const LayerNames names = {{{0, 0, 2}, "bert.encoder.layer.0.attention.self.value"}};
  auto j = nlohmann::json::parse(chrome_trace({{.step = 7, .start = 0, .timeline = &tl},
                                               {.step = 8, .start = tl.step_time + 5, .timeline = &tl}},
                                              "gpipe", names));
  std::map<int, double> marker;  // step -> its start on the steps track
  int named = 0, last_ts_step8 = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "step" && e["ph"] == "X") marker[e["args"]["step"].get<int>()] = e["ts"].get<double>();
    if (e["ph"] != "X" || e.value("cat", "") == "step") continue;
    if (e["args"].contains("layer_name")) {
      ++named;
      EXPECT_EQ(e["name"], "curvature A bert.encoder.layer.0.attention.self.value");
    }
    if (e["args"]["step"] == 8) last_ts_step8 += e["ts"].get<double>() >= (tl.step_time + 5) * 1000;
  }
  EXPECT_EQ(marker.size(), 2u);
  EXPECT_DOUBLE_EQ(marker[7], 0);
  EXPECT_DOUBLE_EQ(marker[8], (tl.step_time + 5) * 1000);
  EXPECT_EQ(named, 2);  // once per step
  EXPECT_EQ(last_ts_step8, static_cast<int>(s.num_actions()));  // step 8's actions after its start
}

// A device of several stages (interleaved: 2 chunks each) names each box's stage beside its
// micro-batch ("3/s5"), where it fits; one stage per device (1F1B) keeps the micro-batch alone.
TEST(Svg, LoopedDevicesNameTheStageOfEachBox) {
  Timeline looped = simulate(make_interleaved(2, 4, 2), uniform(1, 2));
  const std::vector<Box> bs = boxes(timeline_svg(looped, options("t", 2400)));
  int staged = 0;
  for (const Box& b : bs)
    if (b.font > 0) {
      EXPECT_NE(b.label.find("/s"), std::string::npos) << b.label;
      staged += 1;
    }
  EXPECT_GT(staged, 0);
  EXPECT_NE(timeline_svg(looped, options("t", 2400)).find("3/s5: micro-batch 3 of stage 5"), std::string::npos);
  // Interleaved over 2 devices: device 0 holds stages 0 and 2, device 1 stages 1 and 3.
  for (const TimedAction& t : looped.per_device[0])
    if (is_compute(t.action.kind)) EXPECT_EQ(t.action.stage % 2, 0);
  const std::string plain = timeline_svg(simulate(make_1f1b(2, 4), uniform(1, 2)), options("t", 2400));
  for (const Box& b : boxes(plain)) EXPECT_EQ(b.label.find("/s"), std::string::npos) << b.label;
  EXPECT_EQ(plain.find("of stage"), std::string::npos);
}

}  // namespace
}  // namespace pf
