// `pipefisher report RUN_DIR [RUN_DIR...]`: training loss vs steps and vs training time of one
// or several runs from their log.jsonl, raw and smoothed as the PipeFisher paper's Figure 7
// (viz/loss_chart.hpp), with an optional target loss and the points where each run reaches it.
//   pipefisher report runs/nvlamb runs/kfac --target 6.69 --out /tmp/fig7.svg
// Writes the SVG (and a PNG beside it when rsvg-convert is installed) and prints, per run, its
// final losses and where its smoothed loss first reaches the target (--json: one JSON object).
// Time is the run's cumulative step_time_s (training without evaluations).
#include "command.hpp"
#include "core/error.hpp"
#include "core/process.hpp"
#include "viz/loss_chart.hpp"
#include "viz/render.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace pf::app {
namespace {

struct ReportArgs {
  std::vector<std::string> runs, labels;
  std::string out, title = "Training loss";
  std::optional<double> target;
  bool json = false;
};

// One run's curve from RUN_DIR/log.jsonl (or the file itself when given one).
LossCurve read_run(const std::string& run, const std::string& label) {
  namespace fs = std::filesystem;
  const std::string path = fs::is_directory(run) ? run + "/log.jsonl" : run;
  std::ifstream f(path);
  if (!f) usage_error(run, "no run log '{}' (a run directory holds log.jsonl)", path);
  LossCurve c;
  c.name = label.empty() ? fs::path(run).lexically_normal().filename().string() : label;
  if (c.name.empty()) c.name = fs::path(run).lexically_normal().parent_path().filename().string();
  double t = 0;
  std::string line;
  for (int ln = 1; std::getline(f, line); ++ln) {
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      const double step = j.at("step").get<double>(), loss = j.at("loss").get<double>();
      t += j.value("step_time_s", 0.0);
      c.step.push_back(step);
      c.time_s.push_back(t);
      c.loss.push_back(loss);
      if (j.contains("valid_loss")) {
        c.valid_step.push_back(step);
        c.valid_time_s.push_back(t);
        c.valid_loss.push_back(j["valid_loss"].get<double>());
      }
    } catch (const nlohmann::json::exception& e) {
      usage_error(fmt::format("{}:{}", path, ln), "not a run log line (step, loss, step_time_s): {}", e.what());
    }
  }
  if (c.step.empty()) usage_error(path, "holds no logged step");
  return c;
}

// A relative name beginning with '-' would read as an option of the program it is passed to.
std::string dash_safe(const std::string& path) { return path.front() == '-' ? "./" + path : path; }

int run(const ReportArgs& a) {
  if (!a.labels.empty() && a.labels.size() != a.runs.size())
    usage_error("--label", "{} labels for {} runs (give one per run, in order)", a.labels.size(), a.runs.size());
  std::vector<LossCurve> curves;
  for (size_t i = 0; i < a.runs.size(); ++i) curves.push_back(read_run(a.runs[i], a.labels.empty() ? "" : a.labels[i]));
  smooth_curves(curves);
  namespace fs = std::filesystem;
  const std::string out = a.out.empty() ? (fs::is_directory(a.runs[0]) ? a.runs[0] + "/loss.svg" : "loss.svg") : a.out;
  if (out.size() < 5 || out.compare(out.size() - 4, 4, ".svg") != 0) usage_error("--out", "'{}' does not end in .svg", out);
  write_file_atomic(out, loss_chart_svg(curves, {a.title, a.target}), "--out");
  std::string png = out.substr(0, out.size() - 4) + ".png";
  const ProgramResult converted = run_program({"rsvg-convert", "-o", dash_safe(png), dash_safe(out)});
  if (!converted.started || converted.exit_status != 0) png.clear();  // no rsvg-convert: the SVG alone
  nlohmann::json runs = nlohmann::json::array();
  for (const LossCurve& c : curves) {
    nlohmann::json r = {{"name", c.name},
                        {"steps", c.step.back()},
                        {"time_s", c.time_s.back()},
                        {"final_loss", c.loss.back()},
                        {"final_smoothed_loss", c.smoothed.back()},
                        {"final_valid_loss", c.valid_loss.empty() ? nlohmann::json() : nlohmann::json(c.valid_loss.back())}};
    if (a.target) {
      const auto hit = first_crossing(c, c.smoothed, *a.target);
      r["reaches_target"] = hit ? nlohmann::json{{"step", hit->step}, {"time_s", hit->time_s}} : nlohmann::json();
    }
    runs.push_back(r);
  }
  if (a.json) {
    nlohmann::json j = {{"svg", out}, {"png", png.empty() ? nlohmann::json() : nlohmann::json(png)}, {"runs", runs}};
    if (a.target) j["target"] = *a.target;
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  for (const auto& r : runs) {
    std::string line = fmt::format("{}: {} steps, {:.1f} s, final loss {:.4f} (smoothed {:.4f})", r["name"].get<std::string>(),
                                   r["steps"].get<double>(), r["time_s"].get<double>(), r["final_loss"].get<double>(),
                                   r["final_smoothed_loss"].get<double>());
    if (!r["final_valid_loss"].is_null()) line += fmt::format(", validation {:.4f}", r["final_valid_loss"].get<double>());
    if (a.target)
      line += r["reaches_target"].is_null()
                  ? fmt::format("; does not reach {:g}", *a.target)
                  : fmt::format("; reaches {:g} at step {:.1f}, {:.1f} s", *a.target, r["reaches_target"]["step"].get<double>(),
                                r["reaches_target"]["time_s"].get<double>());
    fmt::print("{}\n", line);
  }
  fmt::print("report: {}{}\n", out, png.empty() ? "" : ", " + png);
  return 0;
}

Runner setup(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  app.add_option("runs", a->runs, "Run directories (each with log.jsonl) or log files")->required();
  app.add_option("--out", a->out, "SVG to write (default: RUN_DIR/loss.svg of the first run); a PNG goes beside it "
                                  "when rsvg-convert is installed");
  app.add_option("--target", a->target, "Target loss: drawn, and where each run's smoothed loss first reaches it");
  app.add_option("--label", a->labels, "Name of each run in the legend, in order (default: the directory's name)");
  app.add_option("--title", a->title, "Title of the figure");
  app.add_flag("--json", a->json, "Print one JSON object (per run: final losses, the target's crossing)");
  return [a] { return run(*a); };
}

}  // namespace

PF_COMMAND(report, "report", "Draw training loss vs steps and vs time of runs (log.jsonl), raw and smoothed", setup)

}  // namespace pf::app
