// Optimizer step throughput (parameters per second) on the parameter shapes of two bert-base
// encoder layers (14.2M parameters), next to a memory-bound reference loop touching the same bytes
// as AdamW/NVLAMB (read p, g, m, v; write p, m, v) so the ratio shows how close a step is to the
// machine's bandwidth. Run: build/bench/bench_optim (or --benchmark_filter=nvlamb).
#include "optim/optimizer.hpp"

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <memory>

namespace {

struct Params {
  std::vector<std::unique_ptr<pf::Param>> owned;
  std::vector<pf::Param*> ptrs;
  int64_t count = 0;
  Params() {
    const int64_t h = 768, f = 3072;
    for (int layer = 0; layer < 2; ++layer) {
      std::string pre = "bert.encoder.layer." + std::to_string(layer) + ".";
      for (const char* n : {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"}) {
        add(pre + n + ".weight", {h, h}, true);
        add(pre + n + ".bias", {h}, false);
      }
      add(pre + "intermediate.dense.weight", {f, h}, true);
      add(pre + "intermediate.dense.bias", {f}, false);
      add(pre + "output.dense.weight", {h, f}, true);
      add(pre + "output.dense.bias", {h}, false);
      for (const char* n : {"attention.output.LayerNorm", "output.LayerNorm"}) {
        add(pre + n + ".weight", {h}, false);
        add(pre + n + ".bias", {h}, false);
      }
    }
  }
  void add(const std::string& name, pf::Shape s, bool decay) {
    owned.push_back(std::make_unique<pf::Param>(name, s, decay));
    pf::Param& p = *owned.back();
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      p.value[i] = 0.01f * static_cast<float>(i % 97) - 0.5f;
      p.grad[i] = 1e-4f * static_cast<float>(i % 89) - 4e-3f;
    }
    ptrs.push_back(&p);
    count += p.value.numel();
  }
};

void BM_step(benchmark::State& state, pf::OptimName name) {
  Params ps;
  pf::OptimConfig cfg;
  cfg.name = name;
  auto opt = pf::make_optimizer(cfg);
  opt->step(ps.ptrs, 1e-4);
  for (auto _ : state) opt->step(ps.ptrs, 1e-4);
  state.SetItemsProcessed(state.iterations() * ps.count);
  state.counters["params"] = static_cast<double>(ps.count);
}
BENCHMARK_CAPTURE(BM_step, sgd, pf::OptimName::Sgd)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_step, adamw, pf::OptimName::AdamW)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_step, nvlamb, pf::OptimName::NvLamb)->Unit(benchmark::kMillisecond)->UseRealTime();

// Bandwidth reference: the same 4 reads and 3 writes per parameter, trivial arithmetic.
void BM_bandwidth_reference(benchmark::State& state) {
  Params ps;
  std::vector<pf::Tensor> m, v;
  for (auto* p : ps.ptrs) {
    m.emplace_back(p->value.shape());
    v.emplace_back(p->value.shape());
  }
  for (auto _ : state) {
    for (size_t k = 0; k < ps.ptrs.size(); ++k) {
      float* __restrict w = ps.ptrs[k]->value.data();
      const float* __restrict g = ps.ptrs[k]->grad.data();
      float* __restrict mk = m[k].data();
      float* __restrict vk = v[k].data();
      const int64_t n = ps.ptrs[k]->value.numel();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        mk[i] = 0.9f * mk[i] + g[i];
        vk[i] = 0.9f * vk[i] + g[i];
        w[i] -= 1e-9f * (mk[i] + vk[i]);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * ps.count);
}
BENCHMARK(BM_bandwidth_reference)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

PF_BENCHMARK_MAIN()
