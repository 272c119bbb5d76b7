#include "schedule/zb_auto.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <tuple>

namespace pf {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxShifts = 16;  // warm-up cap shifts tried per slope

// One try of the heuristic.
struct ZbTry {
  std::vector<int> cap;       // [device] stage activations admitted but not yet past their I
  bool forward_first = true;  // F and I both ready: F (fill the pipeline) or I (drain it)
  bool any_wait = false;      // a W also goes into a wait shorter than T_W, delaying what follows
  bool reserve_each = true;   // room for later hosted stages kept per admitted micro-batch, or once
};

// What a device runs next: an F or I of one of its stages, or nothing known to be runnable.
struct ZbNext {
  Kind kind = Kind::F;
  int stage = -1;
  double ready = kInf;  // when its inputs are on the device
  double start = kInf;  // max(device free, ready)
};

struct ZbOrder {
  std::vector<std::vector<Action>> per_device;
  double step_time = 0;
  int peak = 0;  // most stage activations a device holds, F to W
};

// One play of the heuristic for one try: every device picks its next F or I by the rules in
// zb_auto.hpp, the earliest start over all devices running first, so that nothing unknown yet
// could have started before it.
class ZbPlay {
 public:
  ZbPlay(const Schedule& placed, const ZbSpec& t, int limit, const ZbTry& c)
      : t_(t), try_(c), limit_(limit), S_(placed.stages), N_(placed.micro_batches), dev_(placed.stage_device[0]),
        hosted_(placed.devices), free_(placed.devices, 0), waiting_w_(placed.devices), next_(placed.devices),
        order_(placed.devices), f_(S_, 0), i_(S_, 0), w_(S_, 0),
        end_f_(S_, std::vector<double>(N_, kInf)), end_i_(S_, std::vector<double>(N_, kInf)) {
    for (int s = 0; s < S_; ++s) hosted_[dev_[s]].push_back(s);
  }

  std::optional<ZbOrder> run();

 private:
  double arrival(int from, double end, int to) const { return end + (dev_[from] != dev_[to] ? t_.comm : 0); }
  // Stage activations device d holds, counted to each stage's I or W; with reserve_each also those
  // its admitted micro-batches will take on its later stages.
  int held(int d, const std::vector<int>& done) const {
    int n = 0;
    for (int s : hosted_[d]) n += (try_.reserve_each ? f_[hosted_[d].front()] : f_[s]) - done[s];
    return n;
  }
  // Free activations an F of stage s needs: a new micro-batch leaves room for an F of each later
  // stage of the device (with reserve_each its own, counted in held() from then on).
  int needs(int d, int s) const {
    if (s == hosted_[d].front()) return static_cast<int>(hosted_[d].size());
    return try_.reserve_each ? 0 : 1;
  }
  bool admits(int d, int s) const;
  double ready_f(int s) const;
  double ready_i(int s) const;
  ZbNext next_of(int d) const;
  void put(int d, Kind k, int s, double start);
  void run_w(int d) {
    PF_CHECK(!waiting_w_[d].empty(), "zb-auto: no W to free memory on device {}", d);
    const int s = waiting_w_[d].front();
    waiting_w_[d].pop_front();
    put(d, Kind::W, s, free_[d]);
  }
  void run_next(int d);
  bool done_fi(int d) const;

  const ZbSpec& t_;
  const ZbTry& try_;
  const int limit_, S_, N_;
  const std::vector<int> dev_;                 // [stage] -> device
  std::vector<std::vector<int>> hosted_;       // [device] -> its stages, ascending
  std::vector<double> free_;                   // [device] end of its last action
  std::vector<std::deque<int>> waiting_w_;     // [device] stages of the micro-batches past I, before W, in order
  std::vector<ZbNext> next_;                   // [device] its next F or I
  std::vector<std::vector<Action>> order_;
  std::vector<int> f_, i_, w_;                 // [stage] F, I, W run (micro-batches go in order)
  std::vector<std::vector<double>> end_f_, end_i_;  // [stage][micro-batch], inf until run
  int peak_ = 0;                               // most stage activations a device held so far
};

// An F of stage s on device d: within the memory limit (counted to W, less the Ws that can run
// first) and, for a new micro-batch (the device's first stage), the warm-up cap (counted to I).
bool ZbPlay::admits(int d, int s) const {
  const int waiting = static_cast<int>(waiting_w_[d].size());
  if (s == hosted_[d].front() && held(d, i_) + needs(d, s) > try_.cap[d]) return false;
  return held(d, w_) + needs(d, s) - waiting <= limit_;
}

double ZbPlay::ready_f(int s) const {
  const int m = f_[s];
  if (m >= N_) return kInf;
  return s == 0 ? 0 : arrival(s - 1, end_f_[s - 1][m], s);
}

double ZbPlay::ready_i(int s) const {
  const int m = i_[s];
  if (m >= f_[s]) return kInf;
  return s + 1 == S_ ? end_f_[s][m] : std::max(end_f_[s][m], arrival(s + 1, end_i_[s + 1][m], s));
}

// The earliest start among device d's runnable F and I; on a tie the preferred kind, then the
// later stage (it leads to the end of the pipeline or the next I sooner).
ZbNext ZbPlay::next_of(int d) const {
  ZbNext best;
  auto rank = [&](const ZbNext& n) {
    return std::make_tuple(n.start, (n.kind == Kind::F) == try_.forward_first ? 0 : 1, -n.stage);
  };
  for (int s : hosted_[d]) {
    for (Kind k : {Kind::F, Kind::I}) {
      if (k == Kind::F && !admits(d, s)) continue;
      ZbNext n{k, s, k == Kind::F ? ready_f(s) : ready_i(s), 0};
      n.start = std::max(free_[d], n.ready);
      if (n.ready < kInf && rank(n) < rank(best)) best = n;
    }
  }
  return best;
}

void ZbPlay::put(int d, Kind k, int s, double start) {
  int& count = k == Kind::F ? f_[s] : k == Kind::I ? i_[s] : w_[s];
  const int m = count++;
  const double dur = k == Kind::F ? t_.forward : k == Kind::I ? t_.input_grad : t_.weight_grad;
  free_[d] = start + dur;
  if (k == Kind::F) end_f_[s][m] = free_[d];
  if (k == Kind::I) {
    end_i_[s][m] = free_[d];
    waiting_w_[d].push_back(s);
  }
  order_[d].push_back(act(k, s, m));
  int held_now = 0;
  for (int h : hosted_[d]) held_now += f_[h] - w_[h];
  peak_ = std::max(peak_, held_now);
}

bool ZbPlay::done_fi(int d) const {
  for (int s : hosted_[d])
    if (f_[s] < N_ || i_[s] < N_) return false;
  return true;
}

// Device d's next F or I, the Ws of the wait before it first (and those the memory limit asks for).
void ZbPlay::run_next(int d) {
  const ZbNext n = next_[d];
  while (!waiting_w_[d].empty() &&
         (try_.any_wait ? free_[d] < n.ready : free_[d] + t_.weight_grad <= n.ready))
    run_w(d);
  if (n.kind == Kind::F)
    while (held(d, w_) + needs(d, n.stage) > limit_) run_w(d);
  put(d, n.kind, n.stage, std::max(free_[d], n.ready));
  if (done_fi(d))
    while (!waiting_w_[d].empty()) run_w(d);
}

std::optional<ZbOrder> ZbPlay::run() {
  const int D = static_cast<int>(hosted_.size());
  for (int d = 0; d < D; ++d) next_[d] = next_of(d);
  for (int left = 2 * S_ * N_; left > 0; --left) {
    int d = 0;
    for (int e = 1; e < D; ++e)
      if (next_[e].start < next_[d].start) d = e;
    if (next_[d].start == kInf) return std::nullopt;  // every device waits on another: this cap deadlocks
    const ZbNext n = next_[d];
    run_next(d);
    next_[d] = next_of(d);
    const int other = n.kind == Kind::F ? n.stage + 1 : n.stage - 1;  // the stage its output goes to
    if (other >= 0 && other < S_) next_[dev_[other]] = next_of(dev_[other]);
  }
  ZbOrder out;
  for (int d = 0; d < D; ++d) out.step_time = std::max(out.step_time, free_[d]);
  out.peak = peak_;
  out.per_device = std::move(order_);
  return out;
}

// The caps tried: one micro-batch per device (its stages' activations) plus a slope times 1F1B's
// lag (stages from the device's first to the last, less one micro-batch: D - d - 1 with one stage
// per device; slope 2 gives ZB-H2's), shifted by k, within the memory limit; 1F1B's shape first.
std::vector<std::vector<int>> warmup_caps(const Schedule& placed, int limit) {
  const int D = placed.devices;
  std::vector<int> lag(D, 0), least(D, 0);
  for (int s = placed.stages - 1; s >= 0; --s) {
    const int d = placed.stage_device[0][s];
    lag[d] = placed.stages - s;
    ++least[d];
  }
  for (int d = 0; d < D; ++d) lag[d] -= least[d];
  std::vector<std::vector<int>> caps;
  for (int slope : {1, 2, 0}) {
    const int most_lag = slope * *std::max_element(lag.begin(), lag.end());
    const int span = limit + most_lag;  // at most kMaxShifts shifts, evenly spaced, 0 among them
    const int step = std::max(1, (span + kMaxShifts - 1) / kMaxShifts);
    for (int k = -most_lag; k <= limit; k += (k < 0 && k + step > 0) ? -k : step) {
      std::vector<int> cap(D);
      for (int d = 0; d < D; ++d) cap[d] = std::clamp(least[d] + slope * lag[d] + k, least[d], std::max(least[d], limit));
      if (std::find(caps.begin(), caps.end(), cap) == caps.end()) caps.push_back(cap);
    }
  }
  return caps;
}

// The shorter step; on a tie (within rounding) the smaller peak memory.
bool shorter_or_smaller(const ZbOrder& a, const ZbOrder& b) {
  const double tol = 1e-9 * b.step_time;
  return a.step_time < b.step_time - tol || (a.step_time <= b.step_time + tol && a.peak < b.peak);
}

}  // namespace

std::optional<std::vector<std::vector<Action>>> zb_heuristic(const Schedule& placed, const ZbSpec& times, int limit) {
  std::optional<ZbOrder> best;
  const bool shared = placed.stages > placed.devices;  // a device hosts later stages to keep room for
  for (const std::vector<int>& cap : warmup_caps(placed, limit))
    for (bool forward_first : {true, false})
      for (bool any_wait : {false, true})
        for (bool reserve_each : {true, false}) {
          if (!reserve_each && !shared) continue;
          const ZbTry c{cap, forward_first, any_wait, reserve_each};
          std::optional<ZbOrder> o = ZbPlay(placed, times, limit, c).run();
          if (o && (!best || shorter_or_smaller(*o, *best))) best = std::move(o);
        }
  if (!best) return std::nullopt;
  return std::move(best->per_device);
}

}  // namespace pf
