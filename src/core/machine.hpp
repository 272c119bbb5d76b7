#pragma once
// The machine a process runs on, as far as its numbers depend on it: the CPU, the BLAS library and
// the kernel family it chose, the thread count, the load. And the one start-up step that makes the
// BLAS and OpenMP fit the machine (fit_process_to_machine), which every program calls first.
#include <string>

namespace pf {

// Instruction-set levels of x86-64 that change which BLAS kernels can run.
enum class IsaLevel { kBaseline = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3 };

// What the CPU (and the OS's saved register state) supports.
IsaLevel cpu_isa_level();
// The level an OpenBLAS kernel family needs ("Prescott" -> baseline, "Haswell"/"Zen" -> AVX2,
// "SkylakeX"/"Cooperlake" -> AVX-512); unknown names count as baseline. Case-insensitive.
IsaLevel kernel_isa_level(const std::string& openblas_core);
// The kernel family pipefisher asks OpenBLAS for on a CPU of this level ("" for baseline:
// nothing better exists). SkylakeX and Cooperlake run the same sgemm kernels in 0.3.21 (measured
// equal here, bench/RESULTS.md), and SkylakeX needs no BF16.
std::string best_kernel_for(IsaLevel level);
// Whether spotri (LAPACK's SPD inverse after spotrf) may be given a matrix of odd order with this
// kernel family. Debian's OpenBLAS 0.3.21 single-threaded strtri crashes (a movaps on a misaligned
// pointer into its own buffer, in strsm_kernel_RT) at odd orders: every one from 133 with Prescott,
// from 517 with Penryn, some from 255-1025 with Barcelona, Core2, Atom, Dunnington; even orders ran
// clean to 4096. Safe at every odd order to 1101 and at 1537, 2049, 3073, 4097: Haswell, Zen,
// Sandybridge, Nehalem. Every other family, the AVX-512 ones included (not runnable where this was
// measured), counts as unsafe: the caller pads such a block with one row of the identity, which
// leaves its inverse exact.
bool kernel_inverts_odd_orders(const std::string& openblas_core);

// libgomp spins this many times before an idle thread sleeps (its default: 300000). Short enough
// that 2 threads beside a busy process keep up with 1, long enough that an idle machine loses
// little; the measurements behind the choice are in bench/RESULTS.md ("Any machine").
constexpr const char* kShortSpin = "10000";

// The environment the process should run under, as a decision with its reason. Pure: `env`
// reads a variable (nullptr if unset), so it is testable without touching the real environment.
struct EnvironmentFix {
  std::string coretype;     // OPENBLAS_CORETYPE to set, "" = leave as is
  bool short_spin = false;  // set GOMP_SPINCOUNT=kShortSpin
  // Set OPENBLAS_NUM_THREADS=1: under an address-space limit (ulimit -v) OpenBLAS's pool starts
  // no workers when the library loads (each would map a 128 MiB buffer, and one that cannot spins
  // forever and blocks the exit); the run grows the pool once its memory check passed.
  bool blas_pool_later = false;
  bool needed() const { return !coretype.empty() || short_spin || blas_pool_later; }
};
// `address_limited`: the process has a finite RLIMIT_AS.
EnvironmentFix environment_fix(const std::string& loaded_core, IsaLevel cpu,
                               const char* (*env)(const char* name), bool address_limited = false);

// Called first in main(), before MPI or any BLAS call: when OpenBLAS loaded kernels weaker than
// the CPU runs (Debian's OpenBLAS 0.3.21 falls back to generic Prescott kernels on CPUs it does
// not know, 4-5x slower) or OpenMP would spin long in its waits, sets OPENBLAS_CORETYPE and
// GOMP_SPINCOUNT and re-executes the program once (both are read when the libraries load, before
// main). A user's own setting of either variable always wins; PF_NO_REEXEC=1 turns this off.
void fit_process_to_machine(char** argv);

// /proc/cpuinfo's model name ("unknown CPU" without one), and the OpenBLAS kernel family loaded.
std::string cpu_model_name();
std::string blas_kernel_name();

// What ran, for the first line of `train`, summary.json and every benchmark's machine line.
struct MachineInfo {
  std::string cpu;           // /proc/cpuinfo's model name
  std::string blas;          // "OpenBLAS 0.3.21"
  std::string kernel;        // the kernel family in use, e.g. "SkylakeX"
  std::string kernel_chosen_by;  // "pipefisher (OpenBLAS picked Prescott)", "OPENBLAS_CORETYPE", "OpenBLAS"
  int threads = 1;           // OpenMP = OpenBLAS threads of this process
  std::string wait_policy;   // "GOMP_SPINCOUNT=N" or "OMP_WAIT_POLICY=X" as set, "" = libgomp's default
  double load_average = 0;   // 1-minute load average when asked
};
MachineInfo machine_info();
// One line: "CPU ..., OpenBLAS 0.3.21 kernel SkylakeX (pipefisher; OpenBLAS picked Prescott),
// 2 threads, GOMP_SPINCOUNT=10000, load 0.12".
std::string machine_line(const MachineInfo& m);

// This process's memory from /proc/self/status, in bytes (0 when unknown): its peak resident set
// (VmHWM), the part of its resident set that maps files now (RssFile: the binary, libraries,
// token files; pages the kernel may drop under pressure rather than kill for), and its address
// space (VmSize, what ulimit -v limits).
struct ProcessMemory {
  double peak_rss = 0;
  double file_rss = 0;
  double mapped = 0;
};
ProcessMemory process_memory();

// Where measurements of this machine are cached (the perf model, the sgemm peak): $PF_CACHE_DIR,
// else $XDG_CACHE_HOME/pipefisher, else $HOME/.cache/pipefisher, else runs/.cache (relative to the
// working directory).
std::string cache_dir();
// `s` with every character outside [A-Za-z0-9._-] replaced by '_': a cache file's key.
std::string file_name_safe(std::string s);

}  // namespace pf
