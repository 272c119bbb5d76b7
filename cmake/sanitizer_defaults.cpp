// Linked into every program of a sanitizer build (PF_SANITIZE=ON, the `asan` preset): the
// defaults the sanitizer runtimes read at start-up, so that a plain `ctest --test-dir build-asan`
// is strict and needs no environment. An explicit ASAN_OPTIONS / LSAN_OPTIONS still overrides.

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
