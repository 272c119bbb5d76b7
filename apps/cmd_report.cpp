// `pipefisher report RUN_DIR [RUN_DIR...]`: training loss vs steps and vs training time of one
// or several runs from their log.jsonl, raw and smoothed as the PipeFisher paper's Figure 7
// (viz/loss_chart.hpp), with an optional target loss and the points where each run reaches it.
//   pipefisher report runs/nvlamb runs/kfac --target 6.69 --out /tmp/fig7.svg
// Writes the SVG (and a PNG beside it when rsvg-convert is installed; a picture there that it did not
// draw is refused without --overwrite) and prints, per run, its
// final losses and where its smoothed loss first reaches the target (--json: one JSON object).
// Time is the run's cumulative step_time_s (training without evaluations). A skipped step (its loss
// non-finite, logged as null) is a gap in the curves, and counted in the text and the JSON.
//   pipefisher report --account runs/pf/profile --baseline runs/nvlamb/profile [--json]
// instead accounts for PipeFisher's measured step against NVLAMB's from two --profile-dirs
// (report_account.hpp).
#include "command.hpp"
#include "report_account.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/process.hpp"
#include "viz/loss_chart.hpp"
#include "viz/loss_log.hpp"
#include "viz/render.hpp"
#include "viz/smooth.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace pf::app {
namespace {

struct ReportArgs {
  std::vector<std::string> runs, labels;
  std::string out, title = "Training loss";
  std::optional<double> target;
  bool json = false;
  bool overwrite = false;
  std::string account, baseline;  // --account, --baseline: two --profile-dirs
};

// One run's curve from RUN_DIR/log.jsonl (or the file itself when given one).
LossCurve read_run(const std::string& run, const std::string& label) {
  namespace fs = std::filesystem;
  const std::string path = fs::is_directory(run) ? run + "/log.jsonl" : run;
  if (fs::is_directory(path)) usage_error(run, "'{}' is a directory, not a run log", path);
  // A FIFO would block and /dev/zero never end: a run log is a file.
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    usage_error(run, "'{}' is not a regular file (a run log is a file: log.jsonl)", path);
  std::ifstream f(path);
  if (!f) usage_error(run, "no run log '{}' (a run directory holds log.jsonl)", path);
  LossCurve c = read_loss_log(f, path);
  c.name = label.empty() ? fs::path(run).lexically_normal().filename().string() : label;
  if (c.name.empty()) c.name = fs::path(run).lexically_normal().parent_path().filename().string();
  return c;
}

// `--out photo.svg` writes photo.png beside it: a picture already there is replaced only when this
// command drew it (the SVG beside it is a loss chart) or with --overwrite, never someone's photo.
void check_replaceable(const OutputFile& svg, const OutputFile& png, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (overwrite) return;
  std::string head(4096, '\0');
  if (fs::is_regular_file(svg.path, ec)) {
    std::ifstream f(svg.path, std::ios::binary);
    head.resize(static_cast<size_t>(f.read(head.data(), static_cast<std::streamsize>(head.size())).gcount()));
  }
  if (fs::is_regular_file(svg.path, ec) && is_loss_chart_svg(head)) return;
  for (const OutputFile* f : {&svg, &png})
    if (fs::is_regular_file(f->path, ec))
      usage_error("--out", "'{}' exists and is no chart of pipefisher report's{}: give another --out, or --overwrite "
                  "to replace it", f->path, f == &png ? fmt::format(" (no loss chart '{}' beside it)", svg.path) : "");
}

// A number for JSON: null when not finite (a run with no finite loss).
nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

// One run's line of the text report.
std::string run_line(const nlohmann::json& r, const ReportArgs& a) {
  std::string line = fmt::format("{}: {} steps, {:.1f} s", r["name"].get<std::string>(), r["steps"].get<double>(),
                                 r["time_s"].get<double>());
  if (r["final_loss"].is_null())
    line += ", no finite loss";
  else
    line += fmt::format(", final loss {:.4f} (smoothed {:.4f})", r["final_loss"].get<double>(),
                        r["final_smoothed_loss"].get<double>());
  if (const int64_t n = r["skipped_steps"].get<int64_t>(); n > 0)
    line += fmt::format(", {} step{} skipped (non-finite loss)", n, n == 1 ? "" : "s");
  if (!r["final_valid_loss"].is_null()) line += fmt::format(", validation {:.4f}", r["final_valid_loss"].get<double>());
  if (a.target)
    line += r["reaches_target"].is_null()
                ? fmt::format("; does not reach {:g}", *a.target)
                : fmt::format("; reaches {:g} at step {:.1f}, {:.1f} s", *a.target, r["reaches_target"]["step"].get<double>(),
                              r["reaches_target"]["time_s"].get<double>());
  return line;
}

// The PNG of `svg` by rsvg-convert (through argv: no shell reads the names), written to its stdout
// and from there to `png` like every output. Installed but failing is a failure of the report:
// it promised a picture.
enum class Png { made, no_converter, failed };
Png write_png(const OutputFile& png, const std::string& svg) {
  OutputWriter w(png);
  // A relative name beginning with '-' would read as an option.
  const std::string input = svg.front() == '-' ? "./" + svg : svg;
  const ProgramResult r = run_program({"rsvg-convert", input}, w.fd());
  if (!r.started) return Png::no_converter;  // the writer removes its temporary
  if (r.exit_status != 0) return Png::failed;
  w.commit();
  return Png::made;
}

// The note under a run too short for the paper's filter (viz/smooth.hpp), or "".
std::string short_run_note(const LossCurve& c) {
  if (c.smoothing_cutoff == loss_filter_cutoff(kPaperFilterMinSteps)) return "";
  const auto steps = std::count_if(c.loss.begin(), c.loss.end(), [](double v) { return std::isfinite(v); });
  return fmt::format("  warning: {} finite steps, fewer than the {} the paper's filter needs: {}", steps,
                     kPaperFilterMinSteps,
                     c.smoothing_cutoff >= 1
                         ? std::string("not smoothed")
                         : fmt::format("smoothed with cutoff {:.3g} of the Nyquist frequency, not 0.05", c.smoothing_cutoff));
}

// The loss chart's runs, read and smoothed, after the arguments are checked.
std::vector<LossCurve> read_curves(const ReportArgs& a) {
  if (a.runs.empty()) usage_error("runs", "give one or more run directories (each with log.jsonl)");
  if (a.target && !(std::fabs(*a.target) <= kMaxLogValue))
    usage_error("--target", "must be a finite loss (at most {:g} in size), got {}", kMaxLogValue, *a.target);
  if (!a.labels.empty() && a.labels.size() != a.runs.size())
    usage_error("--label", "{} labels for {} runs (give one per run, in order)", a.labels.size(), a.runs.size());
  std::vector<LossCurve> curves;
  for (size_t i = 0; i < a.runs.size(); ++i) curves.push_back(read_run(a.runs[i], a.labels.empty() ? "" : a.labels[i]));
  smooth_curves(curves);
  return curves;
}

// One run's object of the --json output (run_line prints it as text).
nlohmann::json run_summary(const LossCurve& c, const std::optional<double>& target) {
  nlohmann::json r = {{"name", c.name},
                      {"steps", c.step.back()},
                      {"time_s", c.time_s.back()},
                      {"final_loss", number_or_null(last_finite(c.loss))},
                      {"final_smoothed_loss", number_or_null(last_finite(c.smoothed))},
                      {"final_valid_loss", c.valid_loss.empty() ? nlohmann::json() : nlohmann::json(c.valid_loss.back())},
                      {"skipped_steps", c.skipped},
                      {"smoothing_cutoff", c.smoothing_cutoff},
                      {"log_cut_short", c.cut_short}};
  if (target) {
    const auto hit = first_crossing(c, c.smoothed, *target);
    r["reaches_target"] = hit ? nlohmann::json{{"step", hit->step}, {"time_s", hit->time_s}} : nlohmann::json();
  }
  return r;
}

int run(const ReportArgs& a) {
  if (!a.account.empty() || !a.baseline.empty()) {
    if (a.account.empty() || a.baseline.empty() || !a.runs.empty())
      usage_error(a.account.empty() ? "--baseline" : "--account",
                  "the step account takes --account PROFILE_DIR and --baseline PROFILE_DIR, and no run directory");
    return run_step_account(a.account, a.baseline, a.json);
  }
  const std::vector<LossCurve> curves = read_curves(a);
  namespace fs = std::filesystem;
  const std::string out = a.out.empty() ? (fs::is_directory(a.runs[0]) ? a.runs[0] + "/loss.svg" : "loss.svg") : a.out;
  if (out.size() < 5 || out.compare(out.size() - 4, 4, ".svg") != 0) usage_error("--out", "'{}' does not end in .svg", out);
  const OutputFile svg{out, "--out", !a.out.empty()}, png_file{out.substr(0, out.size() - 4) + ".png", "--out"};
  std::vector<NamedPath> logs;
  for (const std::string& r : a.runs) logs.push_back({fs::is_directory(r) ? r + "/log.jsonl" : r, "a run log"});
  check_outputs({svg, png_file}, logs);
  check_replaceable(svg, png_file, a.overwrite);
  write_output(svg, loss_chart_svg(curves, {a.title, a.target}));
  const Png made = write_png(png_file, out);
  if (made == Png::failed) {  // the SVG stays; the status says the picture is missing
    std::fprintf(stderr, "pipefisher report: rsvg-convert could not draw '%s' as '%s'\n", out.c_str(),
                 png_file.path.c_str());
    return 1;
  }
  const std::string png = made == Png::made ? png_file.path : "";
  nlohmann::json runs = nlohmann::json::array();
  for (const LossCurve& c : curves) runs.push_back(run_summary(c, a.target));
  if (a.json) {
    nlohmann::json j = {{"svg", out}, {"png", png.empty() ? nlohmann::json() : nlohmann::json(png)}, {"runs", runs}};
    if (a.target) j["target"] = *a.target;
    fmt::print("{}\n", j.dump(1));
    return 0;
  }
  for (size_t i = 0; i < curves.size(); ++i) {
    fmt::print("{}\n", run_line(runs[i], a));
    if (const std::string note = short_run_note(curves[i]); !note.empty()) fmt::print("{}\n", note);
    if (curves[i].cut_short) fmt::print("  (its log's last line is cut short, as a run stopped mid-write leaves it: left out)\n");
  }
  fmt::print("report: {}{}\n", out, png.empty() ? "" : ", " + png);
  return 0;
}

Runner setup(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  app.add_option("runs", a->runs, "Run directories (each with log.jsonl) or log files");
  app.add_option("--account", a->account, "A PipeFisher run's --profile-dir: account for its measured step against "
                                          "--baseline's, part by part (no loss chart)");
  app.add_option("--baseline", a->baseline, "With --account: the NVLAMB run's --profile-dir (same layout and steps)");
  app.add_option("--out", a->out, "SVG to write (default: RUN_DIR/loss.svg of the first run); a PNG goes beside it "
                                  "when rsvg-convert is installed");
  app.add_option("--target", a->target, "Target loss: drawn, and where each run's smoothed loss first reaches it");
  app.add_option("--label", a->labels, "Name of each run in the legend, in order (default: the directory's name)");
  app.add_option("--title", a->title, "Title of the figure");
  app.add_flag("--json", a->json, "Print one JSON object (per run: final losses, the target's crossing; with "
                                   "--account: every step's parts, units and critical path)");
  app.add_flag("--overwrite", a->overwrite,
               "replace an SVG or PNG at --out's names that is no chart of this command (by default refused)");
  return [a] { return run(*a); };
}

}  // namespace

PF_COMMAND(report, "report", "Draw training loss vs steps and vs time of runs (log.jsonl), raw and smoothed", setup)

}  // namespace pf::app
