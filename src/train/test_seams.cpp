#include "train/test_seams.hpp"

#include "core/error.hpp"

#include <cmath>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <utility>

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

KfacSeams parse_kfac_flags(const std::string& drift_at, const std::string& cost_scale, const std::string& bcast_model,
                           bool fixed_costs) {
  KfacSeams k;
  k.fixed_costs = fixed_costs;
  if (!drift_at.empty()) k.drift_at_step = step_number(drift_at, "--test-drift-at");
  if (!cost_scale.empty()) {
    const size_t comma = cost_scale.find(',');
    k.cost_scale = seam_number(cost_scale.substr(0, comma), "--test-kfac-cost-scale", true);
    if (comma != std::string::npos)
      k.adapt_cost_scale = seam_number(cost_scale.substr(comma + 1), "--test-kfac-cost-scale", true);
  }
  if (!bcast_model.empty()) {
    const size_t comma = bcast_model.find(',');
    if (comma == std::string::npos) usage_error("--test-bcast-model", "expected ALPHA,BETA, got '{}'", bcast_model);
    k.bcast_model = std::pair{seam_number(bcast_model.substr(0, comma), "--test-bcast-model", false),
                              seam_number(bcast_model.substr(comma + 1), "--test-bcast-model", false)};
  }
  return k;
}

NoiseSeam parse_noise_flags(const std::string& slow, const std::string& jitter) {
  NoiseSeam n;
  if (!jitter.empty()) {
    n.jitter = seam_number(jitter, "--bench-jitter", false);
    if (n.jitter > 1) usage_error("--bench-jitter", "{} is over 1 (a fraction of each action's time)", jitter);
  }
  if (slow.empty()) return n;
  const size_t colon = slow.find(':'), at = slow.find('@');
  if (colon == std::string::npos) usage_error("--bench-slow", "expected RANK:FACTOR[@FROM-TO], got '{}'", slow);
  const std::string rank = slow.substr(0, colon);
  const std::string factor = slow.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1);
  char* end = nullptr;
  const long r = std::strtol(rank.c_str(), &end, 10);
  if (rank.empty() || *end != '\0' || r < 0 || r > 1000000) usage_error("--bench-slow", "'{}' is not a rank", rank);
  n.slow_rank = static_cast<int>(r);
  n.slow_factor = seam_number(factor, "--bench-slow", true);
  if (n.slow_factor < 1 || n.slow_factor > 100)
    usage_error("--bench-slow", "factor {} is outside 1 to 100 (how many times as long each action lasts)", factor);
  if (at != std::string::npos) {
    const std::string range = slow.substr(at + 1);
    const size_t dash = range.find('-');
    if (dash == std::string::npos) usage_error("--bench-slow", "expected @FROM-TO steps, got '@{}'", range);
    n.slow_from = step_number(range.substr(0, dash), "--bench-slow");
    n.slow_to = step_number(range.substr(dash + 1), "--bench-slow");
    if (n.slow_to < n.slow_from) usage_error("--bench-slow", "steps {} end before they start", range);
  }
  return n;
}

}  // namespace pf
