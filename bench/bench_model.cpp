// Training-core speed: forward+backward of bert-mini- and bert-base-shaped transformer blocks,
// as tokens/s and as a fraction of this machine's own sgemm throughput measured in the same run
// with the same thread count; heap allocations per steady-state step are counted.
//
//   build/bench/bench_model --benchmark_min_time=2
#include "core/blas.hpp"
#include "nn/blocks.hpp"

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>

using namespace pf;

static std::atomic<bool> counting{false};
static std::atomic<long> allocations{0};
void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// A replaced operator new that mallocs is freed with free: GCC sees new/free and warns anyway.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

// The reference product: (2048 x 768) x (768 x 3072), a transformer MLP's shape.
constexpr int64_t kM = 2048, kK = 768, kN = 3072;

// OpenBLAS's own sgemm with its own threads: this machine's sgemm throughput (the reference).
double sgemm_once(Tensor& a, Tensor& b, Tensor& c, bool ours = false) {
  auto t0 = std::chrono::steady_clock::now();
  (ours ? gemm : blas_gemm)(false, false, kM, kN, kK, 1.0f, a.data(), kK, b.data(), kN, 0.0f, c.data(), kN);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best sgemm FLOP/s over ~0.6 s at this thread count, measured just before each block benchmark
// so both see the same machine (this VM is shared and noisy: ratios, not absolute numbers).
double sgemm_flops(int threads) {
  set_threads(threads);
  Tensor a({kM, kK}), b({kK, kN}), c({kM, kN});
  a.fill(0.5f), b.fill(0.25f);
  double best = 1e9, total = 0;
  for (int i = 0; i < 200 && total < 0.6; ++i) {
    double t = sgemm_once(a, b, c);
    best = std::min(best, t), total += t;
  }
  return 2.0 * kM * kN * kK / best;
}

// args: threads, 0 = OpenBLAS's threading / 1 = pf::gemm (OpenMP slices of single-threaded sgemm)
void BM_Sgemm(benchmark::State& state) {
  const int threads = int(state.range(0));
  set_threads(threads);
  Tensor a({kM, kK}), b({kK, kN}), c({kM, kN});
  a.fill(0.5f), b.fill(0.25f);
  for (auto _ : state) sgemm_once(a, b, c, state.range(1) == 1);
  state.SetLabel(state.range(1) ? "pf::gemm" : "openblas");
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kM * kN * kK * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

ModelConfig block_config(int shape) {
  ModelConfig c;
  c.arch = Arch::Bert;
  c.seq_len = 128;
  if (shape == 0) c.hidden = 256, c.heads = 4, c.ffn = 1024;   // bert-mini
  else c.hidden = 768, c.heads = 12, c.ffn = 3072;             // bert-base
  return c;
}

// args: shape (0 = bert-mini, 1 = bert-base), micro-batch rows, threads
void BM_BlockStep(benchmark::State& state) {
  ModelConfig c = block_config(int(state.range(0)));
  const int rows = int(state.range(1)), threads = int(state.range(2)), T = c.seq_len;
  const double sgemm = sgemm_flops(threads);
  set_threads(threads);
  TransformerBlock blk(c, 0);
  blk.init(1);
  auto st = blk.make_state(rows, T, BackwardMode::fused);
  MicroBatch mb;
  mb.resize(rows, T);
  std::fill(mb.attn_mask.begin(), mb.attn_mask.end(), 1);
  Tensor x({rows, T, c.hidden}), y({rows, T, c.hidden}), dy({rows, T, c.hidden}), dx({rows, T, c.hidden});
  x.fill(0.1f), dy.fill(0.01f);
  for (int i = 0; i < 2; ++i) blk.forward(mb, x, y, *st), blk.backward(mb, dy, dx, *st);  // warm-up
  allocations = 0;
  double best = 1e9;
  counting = true;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    blk.forward(mb, x, y, *st);
    blk.backward(mb, dy, dx, *st);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(t);
    best = std::min(best, t);
  }
  counting = false;
  // Model FLOPs: matrix products only, backward = 2 x forward.
  const double N = double(rows) * T, C = c.hidden, F = c.ffn;
  const double flops = 3.0 * (2.0 * N * (4 * C * C + 2 * C * F) + 4.0 * rows * double(T) * T * C);
  const double it = double(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(N * it, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * it / 1e9, benchmark::Counter::kIsRate);
  state.counters["sgemm_GFLOP/s"] = sgemm / 1e9;
  state.counters["allocs/step"] = double(allocations.load()) / it;
  state.SetLabel(state.range(0) == 0 ? "bert-mini" : "bert-base");
  // The fraction of sgemm a training step reaches: fastest step vs fastest sgemm (both best-of,
  // the fairest comparison on a shared machine).
  state.counters["frac_sgemm"] = flops / best / sgemm;
}

}  // namespace

BENCHMARK(BM_Sgemm)->ArgNames({"threads", "ours"})->ArgsProduct({{1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_BlockStep)
    ->ArgNames({"shape", "rows", "threads"})
    ->ArgsProduct({{0}, {8, 32}, {1, 2}})
    ->ArgsProduct({{1}, {8, 16, 32}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

PF_BENCHMARK_MAIN()
