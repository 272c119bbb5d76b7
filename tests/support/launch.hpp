#pragma once
// Running a command from a test (the built `pipefisher`, mpirun through scripts/pfrun): its exit
// status, its stdout and stderr together, and how long it took.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace pf_test {

struct Launch {
  int status = -1;     // exit status, or -1 when killed by a signal
  std::string out;     // stdout and stderr
  double seconds = 0;  // wall time
};

// `cmd` runs through the shell with stderr joined to stdout.
inline Launch run(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  Launch r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace pf_test
