// `pipefisher machine`: the machine line every run prints first (CPU, BLAS and the kernel family
// it runs, threads, OpenMP's waiting, load), for benchmarks and bug reports.
#include "command.hpp"
#include "core/blas.hpp"
#include "core/machine.hpp"

#include <cstdio>
#include <memory>

namespace {

pf::app::Runner setup(CLI::App& cmd) {
  auto threads = std::make_shared<int>(0);
  cmd.add_option("--threads", *threads, "threads to report, as train.threads (0: all cores)")
      ->check(CLI::Range(0, 4096));
  return [threads] {
    pf::set_threads(*threads);
    std::printf("machine: %s\n", pf::machine_line(pf::machine_info()).c_str());
    return 0;
  };
}

}  // namespace

PF_COMMAND(machine, "machine", "Print the machine line: CPU, BLAS kernels, threads, load", setup)
