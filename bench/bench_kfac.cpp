// K-FAC kernels at transformer sizes: curvature (ssyrk of one micro-batch into a factor),
// inversion (copy + damping + potrf + potri of a factor) and precondition (two sgemm), next to a
// plain d x d x d sgemm in the same run, all as GFLOP/s. Args: {d, threads}.
// Two rates: GFLOP/s over wall-clock time, and cpu_GFLOP/s over the process's CPU time (all
// threads). On a shared machine the second is the one to compare for threads = 1: it does not
// count the time the process waited for a core.
//   curvature  rows * d * (d + 1) flops (ssyrk, upper triangle), rows = kRows tokens
//   inversion  d^3 flops (potrf d^3/3 + potri 2d^3/3)
//   sgemm      2 d^3 flops
//   precondition 4 d^3 flops for a d x d weight (B^-1 G, then (.) A^-1)
#include "core/blas.hpp"
#include "kfac/kfac_layer.hpp"

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <ctime>
#include <random>

namespace {

constexpr int64_t kRows = 1024;  // tokens in one micro-batch (e.g. 8 sequences x 128)

pf::Tensor random_tensor(pf::Shape shape, uint32_t seed) {
  pf::Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : t.span()) v = nd(gen);
  return t;
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Call with the process CPU time taken just before the timed loop.
void set_flops(benchmark::State& state, double flops_per_iter, double cpu_start) {
  const double cpu = process_cpu_seconds() - cpu_start;
  const double total = flops_per_iter * static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cpu_GFLOP/s"] = benchmark::Counter(cpu > 0 ? total * 1e-9 / cpu : 0.0);
}

void BM_Sgemm(benchmark::State& state) {
  const int64_t d = state.range(0);
  pf::set_threads(static_cast<int>(state.range(1)));
  pf::Tensor a = random_tensor({d, d}, 1), b = random_tensor({d, d}, 2), c({d, d});
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    pf::gemm(false, false, d, d, d, 1.0f, a.data(), d, b.data(), d, 0.0f, c.data(), d);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * d * d * d, cpu0);
}

void BM_Curvature(benchmark::State& state) {
  const int64_t d = state.range(0);
  pf::set_threads(static_cast<int>(state.range(1)));
  pf::KfacFactor f("A", d);
  pf::Tensor x = random_tensor({kRows, d}, 3);
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    f.accumulate(x.data(), kRows, d, 1.0f / kRows);
    benchmark::DoNotOptimize(f.accumulator().data());
  }
  set_flops(state, static_cast<double>(kRows) * d * (d + 1), cpu0);
}

void BM_Inversion(benchmark::State& state) {
  const int64_t d = state.range(0);
  pf::set_threads(static_cast<int>(state.range(1)));
  pf::KfacFactor f("A", d);
  pf::Tensor x = random_tensor({2 * d, d}, 4);
  f.accumulate(x.data(), 2 * d, d, 1.0f / (2 * d));
  f.commit();
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    pf::InvertResult r = f.invert(1e-3);
    if (r.status != pf::InvertStatus::Ok) state.SkipWithError("inversion failed");
  }
  set_flops(state, static_cast<double>(d) * d * d, cpu0);
}

void BM_Precondition(benchmark::State& state) {
  const int64_t d = state.range(0);
  pf::set_threads(static_cast<int>(state.range(1)));
  pf::KfacLayer layer("l", d, d);
  pf::Param w("w", {d, d});
  w.grad = random_tensor({d, d}, 5);
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    layer.precondition(w, nullptr);
    benchmark::DoNotOptimize(w.grad.data());
  }
  set_flops(state, 4.0 * d * d * d, cpu0);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int64_t d : {256, 768, 1024, 3072}) b->Args({d, threads});
  b->ArgNames({"d", "threads"})->Unit(benchmark::kMillisecond)->MinTime(0.3)->UseRealTime();
}

BENCHMARK(BM_Sgemm)->Apply(sizes);
BENCHMARK(BM_Curvature)->Apply(sizes);
BENCHMARK(BM_Inversion)->Apply(sizes);
BENCHMARK(BM_Precondition)->Apply(sizes);

}  // namespace

PF_BENCHMARK_MAIN()
