#include "core/machine.hpp"

#include "core/blas.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pf {

namespace {

// Set for the re-executed process: the kernel family OpenBLAS had picked by itself. It is taken
// out of the environment at once, so that programs this one starts decide for themselves.
constexpr const char* kReplacedVar = "PF_BLAS_REPLACED";
std::string replaced_kernel;  // "" when this process was not re-executed

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const char* real_env(const char* name) { return std::getenv(name); }


// "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." -> "OpenBLAS 0.3.21".
std::string blas_name() {
  std::string config = openblas_get_config();
  size_t second_space = config.find(' ', config.find(' ') + 1);
  return config.substr(0, second_space);
}

}  // namespace

std::string blas_kernel_name() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown CPU";
}

IsaLevel cpu_isa_level() {
  __builtin_cpu_init();
  // OpenBLAS's AVX-512 kernels use F, BW, VL and DQ; libgcc checks the OS saves the registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return IsaLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return IsaLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return IsaLevel::kAvx;
  return IsaLevel::kBaseline;
}

IsaLevel kernel_isa_level(const std::string& openblas_core) {
  const std::string c = lower(openblas_core);
  if (c == "skylakex" || c == "cooperlake" || c == "sapphirerapids") return IsaLevel::kAvx512;
  if (c == "haswell" || c == "zen" || c == "skylake") return IsaLevel::kAvx2;
  if (c == "sandybridge" || c == "bulldozer" || c == "piledriver" || c == "steamroller" || c == "excavator")
    return IsaLevel::kAvx;
  return IsaLevel::kBaseline;
}

std::string best_kernel_for(IsaLevel level) {
  switch (level) {
    case IsaLevel::kAvx512: return "SkylakeX";
    case IsaLevel::kAvx2: return "Haswell";
    case IsaLevel::kAvx: return "Sandybridge";
    case IsaLevel::kBaseline: return "";
  }
  return "";
}

bool kernel_inverts_odd_orders(const std::string& openblas_core) {
  const std::string c = lower(openblas_core);
  return c == "haswell" || c == "zen" || c == "sandybridge" || c == "nehalem";
}

EnvironmentFix environment_fix(const std::string& loaded, IsaLevel cpu, const char* (*env)(const char*),
                               bool address_limited) {
  EnvironmentFix fix;
  fix.blas_pool_later = address_limited && !env("OPENBLAS_NUM_THREADS") && !env("GOTO_NUM_THREADS");
  if (!env("OPENBLAS_CORETYPE") && kernel_isa_level(loaded) < cpu) fix.coretype = best_kernel_for(cpu);
  // Idle OpenMP workers spin long by default, taking the core a descheduled sibling or another
  // process needs; a short spin, then sleep, costs little when idle (kShortSpin).
  fix.short_spin = !env("OMP_WAIT_POLICY") && !env("GOMP_SPINCOUNT");
  return fix;
}

void fit_process_to_machine(char** argv) {
  const char* off = std::getenv("PF_NO_REEXEC");
  if (const char* replaced = std::getenv(kReplacedVar)) {  // this is the re-executed process
    replaced_kernel = replaced;
    unsetenv(kReplacedVar);
    return;
  }
  if (off && std::strcmp(off, "0") != 0) return;
  const std::string loaded = blas_kernel_name();
  rlimit as{};
  const bool limited = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY;
  const EnvironmentFix fix = environment_fix(loaded, cpu_isa_level(), real_env, limited);
  if (!fix.needed()) return;
  if (!fix.coretype.empty()) setenv("OPENBLAS_CORETYPE", fix.coretype.c_str(), 1);
  if (fix.short_spin) setenv("GOMP_SPINCOUNT", kShortSpin, 1);
  if (fix.blas_pool_later) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv(kReplacedVar, loaded.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Still here: exec failed (no /proc?). Run as loaded, with the environment as it was, so that
  // machine_info() reports what runs.
  std::fprintf(stderr, "pipefisher: could not re-execute with OPENBLAS_CORETYPE=%s (%s); continuing\n",
               fix.coretype.c_str(), std::strerror(errno));
  if (!fix.coretype.empty()) unsetenv("OPENBLAS_CORETYPE");
  if (fix.short_spin) unsetenv("GOMP_SPINCOUNT");
  if (fix.blas_pool_later) unsetenv("OPENBLAS_NUM_THREADS");
  unsetenv(kReplacedVar);
}

MachineInfo machine_info() {
  MachineInfo m;
  m.cpu = cpu_model_name();
  m.blas = blas_name();
  m.kernel = blas_kernel_name();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (!replaced_kernel.empty() && lower(m.kernel) != lower(replaced_kernel))
    m.kernel_chosen_by = fmt::format("pipefisher; OpenBLAS picked {}", replaced_kernel);
  else if (forced)
    m.kernel_chosen_by = fmt::format("OPENBLAS_CORETYPE={}", forced);
  else
    m.kernel_chosen_by = "OpenBLAS";
  m.threads = num_threads();
  if (const char* spin = std::getenv("GOMP_SPINCOUNT")) m.wait_policy = fmt::format("GOMP_SPINCOUNT={}", spin);
  else if (const char* wait = std::getenv("OMP_WAIT_POLICY")) m.wait_policy = fmt::format("OMP_WAIT_POLICY={}", wait);
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) m.load_average = load[0];
  return m;
}

std::string machine_line(const MachineInfo& m) {
  return fmt::format("{}, {} kernel {} ({}), {} thread{}, {}, load {:.2f}", m.cpu, m.blas,
                     m.kernel, m.kernel_chosen_by, m.threads, m.threads == 1 ? "" : "s",
                     m.wait_policy.empty() ? "OpenMP waits by default" : m.wait_policy, m.load_average);
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream status("/proc/self/status");
  std::string key;
  double kb = 0;
  for (std::string line; std::getline(status, line);) {
    std::istringstream in(line);
    if (!(in >> key >> kb)) continue;
    if (key == "VmHWM:") m.peak_rss = kb * 1024;
    if (key == "RssFile:") m.file_rss = kb * 1024;
    if (key == "VmSize:") m.mapped = kb * 1024;
  }
  return m;
}

std::string cache_dir() {
  if (const char* d = std::getenv("PF_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/pipefisher";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/pipefisher";
  return "runs/.cache";
}

std::string file_name_safe(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return s;
}

}  // namespace pf
