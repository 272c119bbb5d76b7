#include "train/run_log.hpp"

#include "config/limits.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/machine.hpp"
#include "core/progress.hpp"
#include "data/batches.hpp"
#include "nn/flops.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <numeric>

namespace pf {

namespace {

// The CSV columns, in order: the JSON record's fields (absent ones are empty cells).
const std::vector<std::string> kColumns = {"step",        "time",        "elapsed_s",   "loss",
                                           "valid_loss",  "lr",          "grad_norm",   "tokens",
                                           "step_time_s", "tokens_per_s", "model_flops_per_token", "flops_per_s",
                                           "mfu",         "peak_rss_bytes"};
const std::vector<std::string> kKfacColumns = {"precond_grad_norm", "kfac_curvature", "kfac_inversion", "kfac_damping_raised",
                                               "kfac_time_s"};

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, ms);
}

std::string csv_cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {  // one value per rank, separated by spaces (no comma inside a cell)
    std::string cell;
    for (const auto& x : v) cell += (cell.empty() ? "" : " ") + csv_cell(x);
    return cell;
  }
  return v.dump();
}

// "12.3 GFLOP/s".
std::string format_flops(double flops_per_s) {
  const char* unit[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (flops_per_s >= 1000 && u < 5) flops_per_s /= 1000, ++u;
  return fmt::format("{:.3g} {}FLOP/s", flops_per_s, unit[u]);
}

// The step a record line is about (JSON: "step"; CSV: the first cell); -1 for a header or junk.
int64_t step_of(const std::string& line, bool csv) {
  if (csv) {
    char* end = nullptr;
    const long long s = std::strtoll(line.c_str(), &end, 10);
    return end != line.c_str() && (*end == ',' || *end == '\0') ? s : -1;
  }
  const auto j = nlohmann::json::parse(line, nullptr, false);
  return j.is_object() && j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : -1;
}

}  // namespace

RunLog::RunLog(const RunLogOptions& o, std::vector<OutputFile> json, OutputFile csv)
    : o_(o), tty_(isatty(fileno(stderr))), machine_(machine_info()) {
  // First, so that every number the run prints can be traced to the machine that made it.
  std::printf("machine: %s\n", machine_line(machine_).c_str());
  for (auto& p : json) files_.push_back({std::move(p), nullptr, false});
  if (!csv.path.empty()) files_.push_back({std::move(csv), nullptr, true});
  for (File& f : files_) open(f);
}

RunLog::~RunLog() {
  for (File& f : files_) std::fclose(f.f);
}

void RunLog::open(File& file) {
  // On resume: the records up to the checkpoint's step, rewritten, then appended to. The first
  // JSON file (out_dir/log.jsonl) also restores the whole run's counts. Only a regular file is
  // read back: reading /dev/stdout on a pipe would wait for the run's own output.
  const std::string& path = file.out.path;
  const bool in_place = check_output(file.out) == OutputMode::in_place;
  std::string kept;
  if (o_.resume_step >= 0 && !in_place) {
    std::ifstream in(path);
    const bool counts = &file == &files_.front();
    for (std::string line; std::getline(in, line);) {
      const int64_t s = step_of(line, file.csv);
      const bool header = file.csv && s < 0 && kept.empty();
      if (!header && (s < 0 || s > o_.resume_step)) continue;  // junk, or past the checkpoint
      kept += line + "\n";
      if (counts && !header) count_previous(line);
    }
  }
  if (!kept.empty()) write_output(file.out, kept);
  const bool append = !kept.empty() || in_place;
  file.f = ::fdopen(open_output(file.out, O_WRONLY | (append ? O_APPEND : O_TRUNC)), append ? "a" : "w");
  if (!file.f) usage_error(path, "cannot open the log file for writing");
  if (file.csv && kept.empty()) {
    std::fprintf(file.f, "%s%s%s\n", fmt::format("{}", fmt::join(kColumns, ",")).c_str(), o_.kfac ? "," : "",
                 o_.kfac ? fmt::format("{}", fmt::join(kKfacColumns, ",")).c_str() : "");
  }
}

void RunLog::count_previous(const std::string& line) {
  const auto j = nlohmann::json::parse(line);
  // A non-finite loss was written as null.
  auto num = [&](const char* k, double otherwise) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : otherwise; };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (steps_ == 0) first_loss_ = num("loss", nan);
  last_loss_ = num("loss", nan);
  ++steps_;
  tokens_ += num("tokens", 0);
  busy_s_ += num("step_time_s", 0);
  elapsed_before_ = num("elapsed_s", busy_s_);  // logs from before elapsed_s: their busy time
}

void RunLog::step(const StepStats& s, std::optional<double> valid_loss, const std::vector<double>& peak_rss) {
  if (steps_ == 0) first_loss_ = s.loss;
  last_loss_ = s.loss;
  ++steps_;
  ++segment_steps_;
  tokens_ += static_cast<double>(s.tokens);
  busy_s_ += s.step_time_s;
  const double tps = s.step_time_s > 0 ? static_cast<double>(s.tokens) / s.step_time_s : 0;
  const double segment_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double mfu = o_.throughput.mfu(tps, peak_rss.size());

  nlohmann::ordered_json j{{"step", s.step + 1},         {"time", utc_now()}, {"elapsed_s", elapsed_before_ + segment_s},
                           {"loss", s.loss},             {"lr", s.lr},        {"grad_norm", s.grad_norm},
                           {"tokens", s.tokens},         {"step_time_s", s.step_time_s},
                           {"tokens_per_s", tps},
                           {"model_flops_per_token", o_.throughput.model_flops_per_token},
                           {"flops_per_s", o_.throughput.flops_per_s(tps)},
                           {"mfu", mfu},
                           {"peak_rss_bytes", std::vector<int64_t>(peak_rss.begin(), peak_rss.end())}};
  if (valid_loss) j["valid_loss"] = *valid_loss;
  if (o_.kfac) {
    j["precond_grad_norm"] = s.precond_grad_norm;
    j["kfac_curvature"] = s.kfac_curvature;
    j["kfac_inversion"] = s.kfac_inversion;
    j["kfac_damping_raised"] = s.kfac_raised >= 0 ? nlohmann::ordered_json(s.kfac_raised) : nlohmann::ordered_json();
    j["kfac_time_s"] = s.kfac_time_s;
  }
  const std::string line = j.dump() + "\n";
  std::vector<std::string> cells;
  for (const auto& c : kColumns) cells.push_back(csv_cell(j.contains(c) ? j[c] : nullptr));
  if (o_.kfac)
    for (const auto& c : kKfacColumns) cells.push_back(csv_cell(j[c]));
  const std::string row = fmt::format("{}\n", fmt::join(cells, ","));
  for (File& f : files_) {
    // A full disk or a vanished file system: the run stops (exit 2) rather than losing its log.
    errno = 0;
    if (std::fputs(f.csv ? row.c_str() : line.c_str(), f.f) < 0 || std::fflush(f.f) != 0)
      usage_error(f.out.path, "cannot write the log after step {}: {}", s.step + 1, std::strerror(errno ? errno : EIO));
  }

  print_status(status_text(s, tps, mfu, segment_s), valid_loss, s.step + 1 == o_.total_steps,
               s.step);
}

// Megatron's fields: loss, learning rate, gradient norm, step time, tokens/s, MFU; then the time
// so far and to go.
std::string RunLog::status_text(const StepStats& s, double tokens_per_s, double mfu, double segment_s) const {
  const int total = o_.total_steps;
  const double eta = segment_s / static_cast<double>(segment_steps_) * static_cast<double>(total - s.step - 1);
  return fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.4g} | {:.0f} ms | {:.0f} tok/s | "
                     "MFU {:.1f}% | {} elapsed, ETA {}",
                     s.step + 1, fmt::formatted_size("{}", total), total, s.loss, s.lr, s.grad_norm,
                     s.step_time_s * 1000, tokens_per_s, 100 * mfu, clock_time(elapsed_before_ + segment_s),
                     clock_time(eta));
}

void RunLog::print_status(const std::string& text, std::optional<double> valid_loss, bool last, int64_t step) const {
  const std::string valid = valid_loss ? fmt::format(" | valid {:.4f}", *valid_loss) : "";
  if (tty_) {
    // A status line rewritten in place; validation results and the last step stay on screen.
    std::fprintf(stderr, "\r%s%s\033[K%s", text.c_str(), valid.c_str(), (valid_loss || last) ? "\n" : "");
  } else if ((step + 1) % o_.log_every == 0 || step == 0 || last || valid_loss) {
    std::fprintf(stdout, "%s%s\n", text.c_str(), valid.c_str());
    std::fflush(stdout);
  }
}

namespace {
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}
}  // namespace

std::string parameters_line(const std::vector<int64_t>& stage_parameters) {
  if (stage_parameters.empty()) return "";
  const int64_t total = std::accumulate(stage_parameters.begin(), stage_parameters.end(), int64_t{0});
  std::string line = "parameters: " + with_commas(total);
  if (stage_parameters.size() == 1) return line;
  for (size_t k = 0; k < stage_parameters.size(); ++k)
    line += fmt::format("{}stage {}: {}", k == 0 ? " (" : ", ", k, with_commas(stage_parameters[k]));
  return line + ")";
}

RunSummary RunLog::summary(double final_valid_loss, double wall_s, const MemoryUse& memory,
                           const std::vector<int64_t>& stage_parameters, const std::optional<PlanSummary>& plan) const {
  const double peak = std::accumulate(memory.peak_rss.begin(), memory.peak_rss.end(), 0.0);
  const size_t ranks = memory.peak_rss.size();
  const double tps = busy_s_ > 0 ? tokens_ / busy_s_ : 0.0;
  const Throughput& t = o_.throughput;
  auto bytes = [](const std::vector<double>& v) { return std::vector<int64_t>(v.begin(), v.end()); };
  nlohmann::json j{{"steps", steps_},
                   {"first_loss", first_loss_},
                   {"final_loss", last_loss_},
                   {"final_valid_loss", final_valid_loss},
                   {"tokens", tokens_},
                   {"tokens_per_s", tps},
                   {"model_flops_per_token", t.model_flops_per_token},
                   {"flops_per_s", t.flops_per_s(tps)},
                   {"peak_flops_per_s", static_cast<double>(ranks) * t.peak.flops_per_s},
                   {"mfu", t.mfu(tps, ranks)},
                   {"wall_time_s", elapsed_before_ + wall_s},
                   {"parameters",
                    {{"total", std::accumulate(stage_parameters.begin(), stage_parameters.end(), int64_t{0})},
                     {"per_stage", stage_parameters}}},
                   {"machine",
                    {{"cpu", machine_.cpu},
                     {"blas", machine_.blas},
                     {"blas_kernel", machine_.kernel},
                     {"blas_kernel_chosen_by", machine_.kernel_chosen_by},
                     {"threads", machine_.threads},
                     {"openmp_wait", machine_.wait_policy},
                     {"load_average_at_start", machine_.load_average},
                     {"sgemm_peak_flops_per_s", t.peak.flops_per_s},
                     {"sgemm_peak_cache", t.peak.busy ? "" : t.peak.cache_path},
                     {"sgemm_peak_measured_busy", t.peak.busy}}},
                   {"memory",
                    {{"peak_rss_bytes", bytes(memory.peak_rss)},
                     {"file_rss_bytes", bytes(memory.file_rss)},
                     {"estimate_bytes", static_cast<int64_t>(memory.estimate)}}}};
  if (plan)
    j["pipefisher_plan"] = {{"refresh_steps_per_device", plan->refresh_steps},
                            {"planned_step_ms", plan->step_ms},
                            {"planned_step_without_kfac_ms", plan->without_kfac_ms},
                            {"planned_step_precondition_only_ms", plan->precondition_only_ms},
                            {"utilization", plan->utilization}};
  if (plan && plan->soap) j["pipefisher_plan"]["work"] = "SOAP's statistics and eigenbasis refreshes (STAT, EIG_L, EIG_R)";
  const std::string line = fmt::format(
      "summary: {} steps, loss {:.4f} -> {:.4f}, validation loss {:.4f}, {:.0f} tokens/s, {} = {:.1f}% MFU (peak {}{}), "
      "{:.1f} s, peak memory {}{} (estimated at most {})",
      steps_, first_loss_, last_loss_, final_valid_loss, tps, format_flops(t.flops_per_s(tps)), 100 * t.mfu(tps, ranks),
      format_flops(static_cast<double>(ranks) * t.peak.flops_per_s), t.peak.busy ? ", measured on a busy machine" : "",
      elapsed_before_ + wall_s, format_bytes(peak),
      ranks > 1 ? fmt::format(" over {} ranks", ranks) : "", format_bytes(memory.estimate));
  return {j.dump(2) + "\n", line};
}

std::unique_ptr<RunLog> open_run_outputs(const Config& cfg, int64_t resume_step, bool kfac_metrics) {
  const std::string& out = cfg.train.out_dir;
  make_dirs(out, "train.out_dir");
  write_output({out + "/config.toml", "train.out_dir"}, cfg.to_toml());
  std::vector<OutputFile> logs{{out + "/log.jsonl", "train.out_dir"}};
  if (!cfg.train.log_json.empty()) logs.push_back({cfg.train.log_json, "train.log_json", true});
  const Throughput throughput{model_flops_per_token(cfg.model, labelled_per_sequence(cfg.model, cfg.model.seq_len)), sgemm_peak()};
  const RunLogOptions o{cfg.train.steps, cfg.train.log_every, kfac_metrics, resume_step, throughput};
  auto log = std::make_unique<RunLog>(o, std::move(logs), OutputFile{out + "/metrics.csv", "train.out_dir"});
  std::fflush(stdout);  // the machine line first, then what may not be meant
  for (const std::string& w : config_warnings(cfg)) std::fprintf(stderr, "pipefisher: warning: %s\n", w.c_str());
  return log;
}

}  // namespace pf
