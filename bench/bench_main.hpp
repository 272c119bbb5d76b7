#pragma once
// The main() of every benchmark: the BLAS fitted to the machine as in `pipefisher` (so benchmarks
// measure what users run), and the machine line printed in the benchmark's context.
#include "core/machine.hpp"

#include <benchmark/benchmark.h>

#define PF_BENCHMARK_MAIN()                                                                 \
  int main(int argc, char** argv) {                                                         \
    pf::fit_process_to_machine(argv);                                                       \
    benchmark::AddCustomContext("machine", pf::machine_line(pf::machine_info()));           \
    benchmark::Initialize(&argc, argv);                                                     \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;                       \
    benchmark::RunSpecifiedBenchmarks();                                                    \
    benchmark::Shutdown();                                                                  \
    return 0;                                                                               \
  }
