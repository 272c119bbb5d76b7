#pragma once
// Running a command from a test (the built `pipefisher`, mpirun through scripts/pfrun): its exit
// status, its stdout and stderr together, and how long it took; or a Job, read line by line while
// it runs (to signal or kill it at a chosen moment).
#include <signal.h>
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

// A job started through `sh -c 'echo PID $$; exec env CMD'` (so `pid` is the command's own),
// stdout and stderr read line by line; SIGKILLed by pid if still running when destroyed.
struct Job {
  FILE* p = nullptr;
  int pid = -1;
  std::string out;
  explicit Job(const std::string& cmd) {
    p = popen(("sh -c 'echo PID $$; exec env " + cmd + "' 2>&1").c_str(), "r");
    if (p) pid = std::stoi(line().substr(4));
  }
  std::string line() {
    std::array<char, 4096> buf;
    if (!fgets(buf.data(), buf.size(), p)) return "";
    out += buf.data();
    return buf.data();
  }
  // Reads until a line starts with `prefix`; false at end of output.
  bool until(const std::string& prefix) {
    for (std::string l = line(); !l.empty(); l = line())
      if (l.rfind(prefix, 0) == 0) return true;
    return false;
  }
  int finish() {
    while (!line().empty()) {
    }
    const int st = pclose(p);
    p = nullptr;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Job() {
    if (p) kill(pid, SIGKILL), pclose(p);
  }
};

}  // namespace pf_test
