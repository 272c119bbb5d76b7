#include "schedule/generators.hpp"

#include "config/config.hpp"
#include "core/error.hpp"
#include "schedule/list_scheduler.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace pf {

namespace {

void check_sizes(int D, int N) {
  if (D < 1) usage_error("--stages", "must be >= 1 (got {})", D);
  if (N < 1) usage_error("--micro-batches", "must be >= 1 (got {})", N);
}

Schedule empty(const std::string& name, int D, int stages, int pipelines, int N) {
  Schedule s;
  s.name = name;
  s.devices = D;
  s.stages = stages;
  s.pipelines = pipelines;
  s.micro_batches = N;
  s.stage_device = default_stage_device(D, stages, pipelines);
  s.per_device.assign(D, {});
  return s;
}

}  // namespace

Schedule make_naive(int D, int N) {
  check_sizes(D, N);
  Schedule s = empty("naive", D, D, 1, N);
  for (int m = 0; m < N; ++m)
    for (int d = 0; d < D; ++d) {
      s.per_device[d].push_back(act(Kind::F, d, m));
      s.per_device[d].push_back(act(Kind::B, d, m));
    }
  return s;
}

Schedule make_gpipe(int D, int N) {
  check_sizes(D, N);
  Schedule s = empty("gpipe", D, D, 1, N);
  for (int d = 0; d < D; ++d) {
    for (int m = 0; m < N; ++m) s.per_device[d].push_back(act(Kind::F, d, m));
    for (int m = 0; m < N; ++m) s.per_device[d].push_back(act(Kind::B, d, m));
  }
  return s;
}

Schedule make_1f1b(int D, int N) {
  check_sizes(D, N);
  Schedule s = empty("1f1b", D, D, 1, N);
  for (int d = 0; d < D; ++d) {
    auto& o = s.per_device[d];
    const int warmup = std::min(D - d - 1, N);
    // Run warm-up forward passes.
    for (int m = 0; m < warmup; ++m) o.push_back(act(Kind::F, d, m));
    // Run 1F1B in steady state.
    for (int i = 0; i < N - warmup; ++i) {
      o.push_back(act(Kind::F, d, warmup + i));
      o.push_back(act(Kind::B, d, i));
    }
    // Run cool-down backward passes.
    for (int m = N - warmup; m < N; ++m) o.push_back(act(Kind::B, d, m));
  }
  return s;
}

Schedule make_interleaved(int D, int N, int V) {
  check_sizes(D, N);
  if (V < 1) usage_error("--virtual-stages", "must be >= 1 (got {})", V);
  if (N % D != 0)
    usage_error("--micro-batches",
                "interleaved 1F1B needs a multiple of --stages ({}), got {}: micro-batches enter in "
                "groups of D per model chunk, and a partial group would introduce dependency bubbles",
                D, N);
  Schedule s = empty("interleaved", D, D * V, 1, N);
  // Megatron: virtual micro-batch k runs model chunk (k mod DV) / D on micro-batch
  // (k / DV) * D + k mod D; backwards visit the chunks in reverse.
  const int total = N * V;
  auto mb = [&](int k) { return (k / (D * V)) * D + k % D; };
  auto chunk = [&](int k, bool forward) {
    int c = (k % (D * V)) / D;
    return forward ? c : V - 1 - c;
  };
  for (int d = 0; d < D; ++d) {
    auto& o = s.per_device[d];
    auto fwd = [&](int k) { o.push_back(act(Kind::F, chunk(k, true) * D + d, mb(k))); };
    auto bwd = [&](int k) { o.push_back(act(Kind::B, chunk(k, false) * D + d, mb(k))); };
    const int warmup = std::min((D - d - 1) * 2 + (V - 1) * D, total);
    for (int k = 0; k < warmup; ++k) fwd(k);                  // warm-up
    for (int i = 0; i < total - warmup; ++i) fwd(warmup + i), bwd(i);  // steady state
    for (int k = total - warmup; k < total; ++k) bwd(k);      // cool-down
  }
  return s;
}

namespace {

// One Chimera order from the list scheduler (see make_chimera), with durations tf/tb and, within
// a unit and stage, backward first (or forward first); returns the order and its makespan under
// (real_tf, real_tb), replayed on the same dependencies.
std::pair<std::vector<std::vector<Action>>, double> chimera_order(const Schedule& s, int D, int N, double tf, double tb,
                                                                  bool backward_first, double real_tf, double real_tb) {
  std::vector<ListTask> tasks;
  std::map<std::tuple<int, int, int>, int> id;  // (kind, stage, mb) -> task
  for (int m = 0; m < N; ++m) {
    const int unit = m / D, p = (m % D) < D / 2 ? 0 : 1;
    for (int st = 0; st < D; ++st) {
      for (Kind k : {Kind::F, Kind::B}) {
        ListTask t;
        t.action = act(k, st, m, p);
        t.device = s.device_of(p, st);
        t.duration = k == Kind::F ? tf : tb;
        t.priority = {unit, -st, (k == Kind::B) == backward_first ? 0 : 1, m};
        id[{static_cast<int>(k), st, m}] = static_cast<int>(tasks.size());
        tasks.push_back(t);
      }
    }
  }
  for (auto& t : tasks) {
    const int st = t.action.stage, m = t.action.micro_batch;
    if (t.action.kind == Kind::F) {
      if (st > 0) t.preds.push_back(id[{static_cast<int>(Kind::F), st - 1, m}]);
    } else {
      t.preds.push_back(id[{static_cast<int>(Kind::F), st, m}]);
      if (st + 1 < D) t.preds.push_back(id[{static_cast<int>(Kind::B), st + 1, m}]);
    }
  }
  std::vector<std::vector<Action>> order = list_schedule(tasks, D);
  // Replay: every device runs its order; an action starts when its device is free and its
  // predecessors have ended (the order is deadlock-free: it came from a list schedule).
  std::vector<std::vector<int>> ids(D);  // the orders as task indices
  for (int d = 0; d < D; ++d)
    for (const Action& a : order[d]) ids[d].push_back(id.at({static_cast<int>(a.kind), a.stage, a.micro_batch}));
  std::vector<double> end(tasks.size(), -1);
  std::vector<size_t> next(D, 0);
  std::vector<double> free(D, 0);
  double makespan = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int d = 0; d < D; ++d)
      while (next[d] < ids[d].size()) {
        const int t = ids[d][next[d]];
        double ready = free[d];
        bool ok = true;
        for (int pred : tasks[t].preds) {
          if (end[pred] < 0) ok = false;
          ready = std::max(ready, end[pred]);
        }
        if (!ok) break;
        free[d] = end[t] = ready + (tasks[t].action.kind == Kind::F ? real_tf : real_tb);
        makespan = std::max(makespan, end[t]);
        ++next[d];
        progress = true;
      }
  }
  return {std::move(order), makespan};
}

}  // namespace

Schedule make_chimera(int D, int N, double tf, double tb) {
  check_sizes(D, N);
  if (D % 2 != 0)
    usage_error("--stages", "chimera needs an even number of stages (got {}): each device pairs "
                "stage i of the down pipeline with stage D-1-i of the up pipeline", D);
  if (N % D != 0)
    usage_error("--micro-batches", "chimera needs a multiple of --stages ({}), got {}: each basic "
                "unit carries D micro-batches, D/2 per pipeline", D, N);
  if (!(tf > 0) || !(tb > 0)) tf = 1, tb = 2;  // no durations to order for: the paper's ratio
  Schedule s = empty("chimera", D, D, 2, N);
  // Basic unit u carries micro-batches uD..uD+D-1: the first half down (pipeline 0), the second
  // half up (pipeline 1); k = N/D units concatenated. Order by a list scheduler that prefers the
  // earlier unit, then the later stage, then the backward, then the lower micro-batch: with
  // T_b = 2 T_f and N = D this reproduces the paper's closed form D*T_f + (2D-2)*T_b. For the
  // actual T_f/T_b, the orders the scheduler makes with them and with the ratios 1:1 to 1:3,
  // backward or forward first, are replayed with them and the shortest kept (the 1:2
  // backward-first order on a tie).
  std::pair<std::vector<std::vector<Action>>, double> best;
  bool have = false;
  std::vector<std::pair<double, double>> ratios = {{1.0, 2.0}};
  if (tb < 2 * tf) ratios.insert(ratios.end(), {{tf, tb}, {1.0, 1.0}, {1.0, 1.25}, {1.0, 1.5}, {1.0, 1.75}});
  if (N > D) ratios.push_back({1.0, 3.0});  // at N = D and T_b >= 2 T_f, 1:2 is exact already
  for (auto [f, b] : ratios)
    for (bool backward_first : {true, false}) {
      auto cand = chimera_order(s, D, N, f, b, backward_first, tf, tb);
      if (!have || cand.second < best.second - 1e-9 * best.second) best = std::move(cand), have = true;
    }
  s.per_device = std::move(best.first);
  return s;
}

namespace {

// Qi et al.'s handcrafted zero-bubble orders: step x of stage d runs F(x), I(x - k(D-1-d)) and
// W(x - k(D-1)), each only for a micro-batch in [0, N). The warm-up lag k sets the memory: stage 0
// holds k(D-1)+1 micro-batches from F to W (H1: k = 1, 1F1B's D; H2: k = 2, 2D-1). Example, D = 2,
// N = 3, k = 1: stage 0 runs F0 F1 I0 W0 F2 I1 W1 I2 W2, stage 1 runs F0 I0 F1 I1 W0 F2 I2 W1 W2.
Schedule zero_bubble(const std::string& name, int D, int N, int k) {
  Schedule s = empty(name, D, D, 1, N);
  const int lag_w = k * (D - 1);
  for (int d = 0; d < D; ++d) {
    auto& o = s.per_device[d];
    const int lag_i = k * (D - 1 - d);
    for (int x = 0; x < N + lag_w; ++x) {
      if (x < N) o.push_back(act(Kind::F, d, x));
      if (x - lag_i >= 0 && x - lag_i < N) o.push_back(act(Kind::I, d, x - lag_i));
      if (x - lag_w >= 0) o.push_back(act(Kind::W, d, x - lag_w));
    }
  }
  return s;
}

}  // namespace

Schedule make_zb_h1(int D, int N) {
  check_sizes(D, N);
  // The I of the last stage follows its F at once; W waits D-1 steps on every stage and fills the
  // cool-down. Step time N(T_f+T_i+T_w) + (D-1)(T_f+T_i-T_w) for T_w <= T_f (tests/sim).
  return zero_bubble("zb-h1", D, N, 1);
}

Schedule make_zb_h2(int D, int N) {
  check_sizes(D, N);
  if (N < D)
    usage_error("--micro-batches", "zb-h2 needs at least as many micro-batches as stages ({}), got {}: its "
                "warm-up runs up to 2D-1 forwards ahead", D, N);
  // Twice H1's warm-up: every stage is busy from its first F to its last W but for the paper's
  // (D-1-d)(T_f+T_i-2T_w), a parallelogram; step time N(T_f+T_i+T_w) + (D-1)T_f for N >= 2D-1.
  return zero_bubble("zb-h2", D, N, 2);
}

namespace {

// X times 1F1B's peak on device 0 (its D stage activations, h stages per device) in stage
// activations: at least one micro-batch on every device, at most all N.
int zb_memory_limit(const Schedule& s, double X) {
  if (!std::isfinite(X) || !(X > 0) || X > kMaxZbMemory)
    usage_error("--zb-memory", "must be a multiple of 1F1B's peak memory in (0, {}], got {}", kMaxZbMemory, X);
  const int h = s.stages / s.devices;
  const double units = std::floor(X * s.devices * h + 1e-9);
  if (units < h)
    usage_error("--zb-memory", "{} times 1F1B's peak ({} micro-batches' activations) holds less than one micro-batch "
                "on a device", X, s.devices);
  return static_cast<int>(std::min<double>(units, double(s.micro_batches) * h));
}

Schedule zb_ordered(Schedule s, const ZbSpec& zb, int limit) {
  const double work = 3.0 * s.stages * s.micro_batches * s.devices;
  if (work > kMaxZbWork)
    usage_error(s.devices > 64 ? "--stages" : "--micro-batches", "{} orders at most {:g} actions x devices, got {} "
                "stages x {} micro-batches x 3 x {} devices", s.name, kMaxZbWork, s.stages, s.micro_batches, s.devices);
  auto order = zb_heuristic(s, zb, limit);
  // One micro-batch at a time on every device always fits (zb_memory_limit).
  PF_CHECK(order.has_value(), "{}: no order within {} stage activations", s.name, limit);
  s.per_device = std::move(*order);
  return s;
}

}  // namespace

Schedule make_zb_auto(int D, int N, const ZbSpec& zb) {
  check_sizes(D, N);
  Schedule s = empty("zb-auto", D, D, 1, N);
  const int limit = zb_memory_limit(s, zb.memory);
  return zb_ordered(std::move(s), zb, limit);
}

Schedule make_zb_v(int D, int N, const ZbSpec& zb) {
  check_sizes(D, N);
  Schedule s = empty("zb-v", D, 2 * D, 1, N);
  for (int st = D; st < 2 * D; ++st) s.stage_device[0][st] = 2 * D - 1 - st;
  // 1F1B's peak: D micro-batches of a device's layers, 2D of its chunks.
  const int limit = zb_memory_limit(s, 1);
  return zb_ordered(std::move(s), zb, limit);
}

namespace {

// What a generator may use (see make_schedule).
struct GeneratorArgs {
  int D, N, V;
  double tf, tb;
  const ZbSpec& zb;
};

struct Generator {
  ScheduleName name;
  Schedule (*make)(const GeneratorArgs&);
};

// The one table of generators, keyed by the schedule's name (its text: config/enums.hpp).
constexpr Generator kGenerators[] = {
    {ScheduleName::Naive, [](const GeneratorArgs& a) { return make_naive(a.D, a.N); }},
    {ScheduleName::GPipe, [](const GeneratorArgs& a) { return make_gpipe(a.D, a.N); }},
    {ScheduleName::OneFOneB, [](const GeneratorArgs& a) { return make_1f1b(a.D, a.N); }},
    {ScheduleName::Interleaved, [](const GeneratorArgs& a) { return make_interleaved(a.D, a.N, a.V); }},
    {ScheduleName::Chimera, [](const GeneratorArgs& a) { return make_chimera(a.D, a.N, a.tf, a.tb); }},
    {ScheduleName::ZbH1, [](const GeneratorArgs& a) { return make_zb_h1(a.D, a.N); }},
    {ScheduleName::ZbH2, [](const GeneratorArgs& a) { return make_zb_h2(a.D, a.N); }},
    {ScheduleName::ZbAuto, [](const GeneratorArgs& a) { return make_zb_auto(a.D, a.N, a.zb); }},
    {ScheduleName::ZbV, [](const GeneratorArgs& a) { return make_zb_v(a.D, a.N, a.zb); }},
};

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Generator& g : kGenerators) v.push_back(name_of(g.name));
    return v;
  }();
  return names;
}

ScheduleName schedule_name(const std::string& name, const std::string& flag) {
  const std::optional<ScheduleName> s = parse_name<ScheduleName>(name);
  if (!s) usage_error(flag, "unknown schedule '{}' (expected one of {})", name, fmt::join(schedule_names(), ", "));
  return *s;
}

Schedule make_schedule(ScheduleName name, int D, int N, int V, double tf, double tb, const ZbSpec& zb) {
  for (const Generator& g : kGenerators)
    if (name == g.name) return g.make({D, N, V, tf, tb, zb});
  PF_CHECK(false, "no generator for schedule #{}", static_cast<int>(name));
  return {};
}

Schedule make_schedule(const std::string& name, int D, int N, int V, double tf, double tb, const ZbSpec& zb) {
  return make_schedule(schedule_name(name, "--schedule"), D, N, V, tf, tb, zb);
}

int64_t schedule_size_bound(ScheduleName name, int D, int N, int V) {
  const int chunks_per_device = name == ScheduleName::Interleaved ? V : name == ScheduleName::ZbV ? 2 : 1;
  return int64_t{6} * D * N * chunks_per_device;
}

}  // namespace pf
