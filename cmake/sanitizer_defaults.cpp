// Linked into every program of a sanitizer build (PF_SANITIZE=ON, the `asan` preset): the
// defaults the sanitizer runtimes read at start-up, so that a plain `ctest --test-dir build-asan`
// is strict and needs no environment. An explicit ASAN_OPTIONS / LSAN_OPTIONS still overrides.

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

// An MPI rank launched by mpirun (OpenMPI sets OMPI_COMM_WORLD_SIZE before exec): no leak check.
// OpenMPI's dlopen'ed components allocate at MPI_Init and are unloaded at MPI_Finalize, so their
// leak reports have no module to suppress by ("<unknown module>"). Everything else (every test
// program, single-process pipefisher) keeps LeakSanitizer on.
// This runs while ASan initialises: before the C library has set up `environ` (getenv returns
// null) and before ASan's interceptors work (read, strlen, ... would crash). So: raw system calls
// into a static buffer, and a plain loop, itself not instrumented (no shadow memory yet).
extern "C" __attribute__((no_sanitize("address", "undefined"))) const char* __asan_default_options() {
  static char env[1 << 16];
  const long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/environ", O_RDONLY);
  if (fd < 0) return "";
  const long n = syscall(SYS_read, fd, env, sizeof env - 1);
  syscall(SYS_close, fd);
  static const char key[] = "OMPI_COMM_WORLD_SIZE=";
  for (long i = 0; i < n;) {  // NUL-separated NAME=value entries
    long k = 0;
    while (key[k] && i + k < n && env[i + k] == key[k]) ++k;
    if (!key[k]) return "detect_leaks=0";
    while (i < n && env[i]) ++i;
    ++i;
  }
  return "";
}

// UBSan: the first report fails the program.
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

// LeakSanitizer stays on for our code. OpenMPI and the libraries under it (PMIx, hwloc, libevent,
// its dlopen'ed mca_* components) keep allocations until exit by design; a leak whose allocation
// stack passes through them is theirs.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\n"
         "leak:libopen-pal.so\n"
         "leak:libopen-rte.so\n"
         "leak:libpmix.so\n"
         "leak:libhwloc.so\n"
         "leak:libevent\n"
         "leak:mca_\n";
}
