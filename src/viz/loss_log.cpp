#include "viz/loss_log.hpp"

#include "core/error.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <optional>

namespace pf {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One line's field: absent, null (a non-finite value the writer could not spell), or a number
// within kMaxLogValue. `where` is "path:line".
struct Field {
  bool present = false;
  std::optional<double> value;  // empty for null
};

Field field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) return {};
  if (it->is_null()) return {true, std::nullopt};
  if (!it->is_number()) usage_error(where, "\"{}\" must be a number, got {}", key, it->type_name());
  const double v = it->get<double>();
  if (!(std::fabs(v) <= kMaxLogValue)) usage_error(where, "\"{}\" = {:g} is beyond any value a run logs", key, v);
  return {true, v};
}

// Appends one record of the log to c; t is the curve's cumulative training time.
void add_record(const nlohmann::json& j, const std::string& where, LossCurve& c, double& t) {
  if (!j.is_object()) usage_error(where, "not a run log record (a JSON object with step, loss, step_time_s)");
  const Field step = field(j, "step", where), loss = field(j, "loss", where);
  if (!step.value || *step.value < 0 || *step.value != std::floor(*step.value))
    usage_error(where, "\"step\" must be a whole number >= 0 (a run log record has step, loss, step_time_s)");
  if (!loss.present) usage_error(where, "no \"loss\" (a run log record has step, loss, step_time_s)");
  // A run writes its steps in order (a resumed run drops the records past its checkpoint): lines
  // out of order, or two runs in one file, would draw and report another run than either.
  if (!c.step.empty() && *step.value <= c.step.back())
    usage_error(where, "step {:g} after step {:g}: a run log's steps increase (its lines are out of order, or it "
                "holds more than one run)", *step.value, c.step.back());
  const Field dt = field(j, "step_time_s", where);
  if (dt.present && !(dt.value && *dt.value >= 0))
    usage_error(where, "\"step_time_s\" must be a non-negative number of seconds, got {}", j["step_time_s"].dump());
  t += dt.value.value_or(0);
  c.step.push_back(*step.value);
  c.time_s.push_back(t);
  c.loss.push_back(loss.value.value_or(kNaN));
  if (!loss.value) ++c.skipped;
  if (const Field v = field(j, "valid_loss", where); v.value) {
    c.valid_step.push_back(*step.value);
    c.valid_time_s.push_back(t);
    c.valid_loss.push_back(*v.value);
  }
}

}  // namespace

namespace {

// A log line is a few hundred bytes: one longer than this is no run log (a file of zeros without
// a newline would otherwise be read whole into one line).
constexpr size_t kMaxLogLine = size_t{1} << 20;

bool read_line(std::istream& in, std::string& line, const std::string& path, int64_t ln) {
  line.clear();
  for (int ch; (ch = in.get()) != std::char_traits<char>::eof();) {
    if (ch == '\n') return true;
    if (line.size() == kMaxLogLine) usage_error(fmt::format("{}:{}", path, ln), "a line over 1 MiB: not a run log");
    line.push_back(static_cast<char>(ch));
  }
  return !line.empty();
}

}  // namespace

LossCurve read_loss_log(std::istream& in, const std::string& path) {
  LossCurve c;
  double t = 0;
  std::string line;
  for (int64_t ln = 1; read_line(in, line, path, ln); ++ln) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = fmt::format("{}:{}", path, ln);
    if (j.is_discarded()) {
      if (in.eof()) {  // the last line, without its newline: cut off mid-write
        c.cut_short = true;
        break;
      }
      usage_error(where, "not JSON (a run log has one JSON object per line)");
    }
    add_record(j, where, c, t);
  }
  if (in.bad()) usage_error(path, "read error");
  if (c.step.empty()) usage_error(path, "holds no logged step");
  return c;
}

}  // namespace pf
