// Schedules at scale: generate, validate and simulate D = 64 stages, N = 512 micro-batches for
// every generator (interleaved with V = 2, i.e. twice the actions). The bar: the whole
// chain well under a second.
#include "schedule/generators.hpp"
#include "schedule/validate.hpp"
#include "sim/sim.hpp"

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

namespace {

const char* kNames[] = {"naive", "gpipe", "1f1b", "interleaved", "chimera", "zb-h1", "zb-h2"};
constexpr int D = 64, N = 512;

pf::CostModel cost() {
  pf::CostModel c;
  c.stages[0].forward = 1;
  c.stages[0].backward = 2;
  c.p2p_latency = 0.05;
  return c;
}

// Generate + validate + simulate: what `pipefisher plan` does before rendering.
void BM_Plan(benchmark::State& st) {
  const char* name = kNames[st.range(0)];
  st.SetLabel(name);
  size_t actions = 0;
  for (auto _ : st) {
    pf::Schedule s = pf::make_schedule(name, D, N, 2);
    pf::validate(s);
    pf::Timeline tl = pf::simulate(s, cost());
    benchmark::DoNotOptimize(tl.step_time);
    actions = s.num_actions();
  }
  st.counters["actions"] = static_cast<double>(actions);
}
BENCHMARK(BM_Plan)->DenseRange(0, 5)->Unit(benchmark::kMillisecond);

void BM_Generate(benchmark::State& st) {
  const char* name = kNames[st.range(0)];
  st.SetLabel(name);
  for (auto _ : st) benchmark::DoNotOptimize(pf::make_schedule(name, D, N, 2).per_device.data());
}
BENCHMARK(BM_Generate)->DenseRange(0, 5)->Unit(benchmark::kMillisecond);

void BM_Validate(benchmark::State& st) {
  const char* name = kNames[st.range(0)];
  st.SetLabel(name);
  pf::Schedule s = pf::make_schedule(name, D, N, 2);
  for (auto _ : st) pf::validate(s);
}
BENCHMARK(BM_Validate)->DenseRange(0, 5)->Unit(benchmark::kMillisecond);

void BM_Simulate(benchmark::State& st) {
  const char* name = kNames[st.range(0)];
  st.SetLabel(name);
  pf::Schedule s = pf::make_schedule(name, D, N, 2);
  for (auto _ : st) benchmark::DoNotOptimize(pf::simulate(s, cost()).step_time);
}
BENCHMARK(BM_Simulate)->DenseRange(0, 5)->Unit(benchmark::kMillisecond);

}  // namespace

PF_BENCHMARK_MAIN()
