// Renderings (SVG timeline, Chrome trace, terminal text, sweep table and chart).
#include "core/error.hpp"
#include "schedule/generators.hpp"
#include "sim/sweep.hpp"
#include "viz/render.hpp"
#include "viz/style.hpp"
#include "viz/sweep_chart.hpp"
#include "../support/scratch.hpp"

#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

TEST(Svg, OneBoxPerActionPerStepWithTitleAndLegend) {
  Schedule s = make_chimera(4, 8);
  Timeline tl = simulate(s, uniform(1, 2));
  std::string svg = timeline_svg(tl, {.title = "chimera D=4 N=8", .unit = "ms", .steps = 2, .width = 1200, .step_starts = {}, .first_step = 1});
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
  std::string svg = timeline_svg(simulate(s, c), {.title = "k", .unit = "ms", .steps = 1, .width = 1200, .step_starts = {}, .first_step = 1});
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
  EXPECT_EQ(meta, 3u * 4);  // per device: its name, its order, its two threads' names
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
  const std::string svg = timeline_svg(tl, {.title = "measured", .unit = "ms", .steps = 1, .width = 600, .step_starts = {}, .first_step = 8});
  EXPECT_NE(svg.find(">step 8<"), std::string::npos);
  EXPECT_EQ(svg.find(">step 1<"), std::string::npos);
}

TEST(Text, TerminalRowsShowKindsAndIdle) {
  // 1F1B, D = 2, N = 1, T_f = T_b = 1: step 4, one column per time unit.
  Timeline tl = simulate(make_1f1b(2, 1), uniform(1, 1));
  EXPECT_EQ(timeline_text(tl, 4), "   0 |F..B|\n   1 |.FB.|\n");
  EXPECT_EQ(timeline_text(tl, 8), "   0 |F0....B0|\n   1 |..F0B0..|\n");
}

TEST(Files, AtomicWriteLeavesNoTemporary) {
  const auto dir = pf_test::scratch_dir("test_viz");
  auto path = (dir / "out.svg").string();
  write_file_atomic(path, "hello", "--svg");
  std::ifstream f(path);
  std::string body((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(body, "hello");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_THROW(write_file_atomic("/nonexistent-dir/x.svg", "x", "--svg"), UsageError);
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
  std::string svg = sweep_svg(rows, "t");
  EXPECT_EQ(count(svg, "<path"), 2u * 6);  // per panel: 2 depths x 3 multiples
}

}  // namespace
}  // namespace pf
