#include "train/test_seams.hpp"

#include "core/error.hpp"

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>

namespace pf {

namespace {

// A step number from 1: digits only.
int64_t step_number(const std::string& text, const char* flag) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1) usage_error(flag, "'{}' is not a step number (from 1)", text);
  return n;
}

// A finite number >= 0 (> 0 when `positive`).
double seam_number(const std::string& text, const char* flag, bool positive) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(x) || x < 0 || (positive && x == 0))
    usage_error(flag, "'{}' is not a finite {} number", text, positive ? "positive" : "non-negative");
  return x;
}

}  // namespace

void PoisonStep::poison_inputs(int64_t index, std::vector<MicroBatch>& mbs) const {
  if (step == 0 || index + 1 != step || kind == Kind::loss) return;
  const float bad = kind == Kind::inf ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  for (MicroBatch& mb : mbs) mb.loss_scale = bad;
}

void SignalSeam::at(Where w, int64_t step_number) const {
  if (where == Where::none || w != where || (w != Where::final_writes && step_number != step)) return;
  std::raise(signal);
}

PoisonStep parse_poison_flag(const std::string& value) {
  PoisonStep p;
  if (value.empty()) return p;
  const size_t colon = value.find(':');
  const std::string kind = colon == std::string::npos ? "nan" : value.substr(colon + 1);
  p.step = step_number(value.substr(0, colon), "--test-poison");
  if (kind == "nan") p.kind = PoisonStep::Kind::nan;
  else if (kind == "inf") p.kind = PoisonStep::Kind::inf;
  else if (kind == "loss") p.kind = PoisonStep::Kind::loss;
  else usage_error("--test-poison", "unknown kind '{}' (expected nan, inf or loss)", kind);
  return p;
}

SignalSeam parse_signal_flag(const std::string& value) {
  SignalSeam s;
  if (value.empty()) return s;
  const size_t at = value.find('@');
  if (at == std::string::npos) usage_error("--test-signal", "expected SIG@WHERE, got '{}'", value);
  const std::string sig = value.substr(0, at), where = value.substr(at + 1);
  if (sig == "TERM") s.signal = SIGTERM;
  else if (sig == "INT") s.signal = SIGINT;
  else if (sig == "USR1") s.signal = SIGUSR1;
  else if (sig == "KILL") s.signal = SIGKILL;
  else usage_error("--test-signal", "unknown signal '{}' (expected TERM, INT, USR1 or KILL)", sig);
  if (where == "final-writes") {
    s.where = SignalSeam::Where::final_writes;
  } else if (where.rfind("step:", 0) == 0) {
    s.where = SignalSeam::Where::step;
    s.step = step_number(where.substr(5), "--test-signal");
  } else if (where.rfind("eval:", 0) == 0) {
    s.where = SignalSeam::Where::eval;
    s.step = step_number(where.substr(5), "--test-signal");
  } else {
    usage_error("--test-signal", "unknown moment '{}' (expected step:N, eval:N or final-writes)", where);
  }
  return s;
}

KfacSeams parse_kfac_flags(const std::string& drift_at, const std::string& cost_scale, const std::string& bcast_model) {
  KfacSeams k;
  if (!drift_at.empty()) k.drift_at_step = step_number(drift_at, "--test-drift-at");
  if (!cost_scale.empty()) k.cost_scale = seam_number(cost_scale, "--test-kfac-cost-scale", true);
  if (!bcast_model.empty()) {
    const size_t comma = bcast_model.find(',');
    if (comma == std::string::npos) usage_error("--test-bcast-model", "expected ALPHA,BETA, got '{}'", bcast_model);
    k.bcast_model = std::pair{seam_number(bcast_model.substr(0, comma), "--test-bcast-model", false),
                              seam_number(bcast_model.substr(comma + 1), "--test-bcast-model", false)};
  }
  return k;
}

}  // namespace pf
