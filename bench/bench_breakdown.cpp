// Where one training step's time goes (issue 51): a single-process step of a model from its
// config, split by the kernel clock (core/kernel_clock.hpp) into kernel classes. For each: its
// time per step and share; for products their rate against this run's sgemm; for the rest the
// bytes they must move at least against this run's memory copy rate. The step's own rate is its
// products' flops (the model FLOPs: tests/nn/test_flops.cpp) over its time, as a fraction of sgemm.
//
//   build/bench/bench_breakdown [--config configs/gpt2-mini.toml] [--set key=value ...]
//                               [--threads 2] [--rounds 5] [--steps 3] [--warmup 2]
//
// Each of `rounds` rounds times `steps` steps after `warmup` untimed ones; a class's figure is the
// median over rounds of its mean per step. Real data: the config's token files, as `train` reads.
// `--set model.logit_chunk_rows=N` weighs the head's memory against its time.
#include "config/config.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/kernel_clock.hpp"
#include "core/machine.hpp"
#include "core/peak_flops.hpp"
#include "core/tensor.hpp"
#include "train/trainer.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace pf;

namespace {

struct Options {
  std::string config = std::string(PF_SOURCE_DIR) + "/configs/gpt2-mini.toml";
  std::vector<std::string> sets;
  int threads = 2, rounds = 5, steps = 3, warmup = 2;
};

int positive(const char* flag, const char* value) {
  constexpr long most = 1000;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (*value == '\0' || *end != '\0' || v < 1 || v > most)
    throw UsageError(fmt::format("{}: expected a whole number from 1 to {}, got '{}'", flag, most, value));
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc)
      throw UsageError(fmt::format("{}: needs a value (flags: --config --set --threads --rounds --steps --warmup)", a));
    const char* v = argv[++i];
    if (a == "--config") o.config = v;
    else if (a == "--set") o.sets.emplace_back(v);
    else if (a == "--threads") o.threads = positive("--threads", v);
    else if (a == "--rounds") o.rounds = positive("--rounds", v);
    else if (a == "--steps") o.steps = positive("--steps", v);
    else if (a == "--warmup") o.warmup = positive("--warmup", v);
    else throw UsageError(fmt::format("{}: not a flag of bench_breakdown", a));
  }
  return o;
}

// This run's memory rate: a parallel copy of 256 MiB (far past the caches), bytes read and
// written over the best of 5.
double copy_bytes_per_s() {
  const int64_t n = int64_t{1} << 26;
  Tensor src(Shape{n}), dst(Shape{n});
  src.fill(1.0f), dst.zero();
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst.data() + i, src.data() + i, 4096 * sizeof(float));
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * sizeof(float) / best;
}

// Per class (and the step, last) the mean per step of one round's tally.
struct Round {
  std::vector<double> seconds, bytes, flops;
  double step = 0;
};

Round time_round(Trainer& trainer, int steps) {
  Round r{std::vector<double>(kKernelClasses), std::vector<double>(kKernelClasses), std::vector<double>(kKernelClasses)};
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    kernel_clock::start();
    trainer.step();
    const KernelTally t = kernel_clock::stop();
    r.step += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    for (int k = 0; k < kKernelClasses; ++k) {
      r.seconds[k] += t.seconds[k] / steps;
      r.bytes[k] += t.bytes[k] / steps;
      r.flops[k] += t.flops[k] / steps;
    }
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class F>
double median_of(const std::vector<Round>& rounds, F&& f) {
  std::vector<double> v;
  for (const Round& r : rounds) v.push_back(f(r));
  return median(v);
}

bool is_product(int k) {
  return k == static_cast<int>(Kernel::block_products) || k == static_cast<int>(Kernel::head_products) ||
         k == static_cast<int>(Kernel::attention_products);
}

void print_table(const std::vector<Round>& rounds, double sgemm, double copy, int64_t tokens) {
  const double step = median_of(rounds, [](const Round& r) { return r.step; });
  std::printf("%-24s %9s %6s %9s %8s %9s %7s\n", "kernel class", "ms/step", "share", "GFLOP/s", "of sgemm", "GB/s",
              "of copy");
  double classes = 0, flops = 0;
  for (int k = 0; k < kKernelClasses; ++k) {
    const double s = median_of(rounds, [k](const Round& r) { return r.seconds[k]; });
    const double b = median_of(rounds, [k](const Round& r) { return r.bytes[k]; });
    const double f = median_of(rounds, [k](const Round& r) { return r.flops[k]; });
    if (s == 0 && b == 0 && f == 0) continue;
    classes += s, flops += f;
    std::printf("%-24s %9.2f %5.1f%%", kernel_name(static_cast<Kernel>(k)), 1e3 * s, 100 * s / step);
    if (is_product(k)) std::printf(" %9.1f %8.2f\n", f / s / 1e9, f / s / sgemm);
    else if (b > 0) std::printf(" %9s %8s %9.1f %7.2f\n", "", "", b / s / 1e9, b / s / copy);
    else std::printf("\n");
  }
  std::printf("%-24s %9.2f %5.1f%%\n", "other", 1e3 * (step - classes), 100 * (step - classes) / step);
  std::printf("%-24s %9.2f %5.1f%% %9.1f %8.2f   (model FLOPs over the step)\n", "step", 1e3 * step, 100.0,
              flops / step / 1e9, flops / step / sgemm);
  std::printf("breakdown: %.2f ms, %.1f tokens/s\n", 1e3 * step, tokens / step);
}

int run(const Options& o) {
  std::vector<std::string> sets = {fmt::format("train.threads={}", o.threads)};  // the user's --set may override
  sets.insert(sets.end(), o.sets.begin(), o.sets.end());
  const Config cfg = Config::load(o.config, sets);
  Trainer trainer(cfg);  // sets the threads
  const double sgemm = measure_sgemm_peak(), copy = copy_bytes_per_s();
  std::printf("machine: %s\n", machine_line(machine_info()).c_str());
  std::printf("%s: %lld tokens per step (%d micro-batches x %d x %d), %d threads, logits %d rows at a time; %d "
              "rounds of %d steps after %d\n",
              cfg.model.preset.c_str(), static_cast<long long>(trainer.tokens_per_step()), cfg.parallel.micro_batches,
              cfg.parallel.micro_batch_size, cfg.model.seq_len, num_threads(), cfg.model.logit_chunk_rows, o.rounds, o.steps,
              o.warmup);
  std::printf("sgemm (1024^3, this run): %.1f GFLOP/s; memory copy (read + write, 256 MiB): %.1f GB/s\n",
              sgemm / 1e9, copy / 1e9);
  for (int s = 0; s < o.warmup; ++s) trainer.step();
  std::vector<Round> rounds;
  for (int r = 0; r < o.rounds; ++r) rounds.push_back(time_round(trainer, o.steps));
  print_table(rounds, sgemm, copy, trainer.tokens_per_step());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fit_process_to_machine(argv);
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bench_breakdown: %s\n", e.what());
    return 2;
  }
}
