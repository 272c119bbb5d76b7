#include "comm/rank_monitor.hpp"

#include "comm/wait.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

namespace pf::comm {

namespace {

std::atomic<int64_t> g_step{0};
std::atomic<int> g_running{0};
std::atomic<int> g_rank{-1};
std::function<std::string()>* g_note_fn = nullptr;  // set while a RankMonitor lives
std::vector<std::pair<int, int>> g_local_peers;       // (rank, pid) of the other ranks on this host, likewise

// The note for the crash handler, preformatted (a signal handler cannot format): two buffers, the
// index of the current one swapped atomically after the other is written.
std::array<std::array<char, 1024>, 2> g_note_buf{};
std::atomic<int> g_note_cur{0};
std::mutex g_note_mutex;

// A rank that reported its own crash leaves this marker, so its neighbours do not repeat it.
std::string marker_path(int pid) {
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return fmt::format("{}/pipefisher-reported-{}", dir, pid);
}
std::array<char, 128> g_marker{};

void refresh_note() {
  if (!g_note_fn) return;
  const std::string note = (*g_note_fn)();
  std::lock_guard<std::mutex> lock(g_note_mutex);
  const int next = 1 - g_note_cur.load();
  std::snprintf(g_note_buf[next].data(), g_note_buf[next].size(), "%s", note.c_str());
  g_note_cur.store(next);
}

// "boot-id pid-namespace": ranks with the same identity see each other's pids.
std::string host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  return boot + " " + std::string(ns, n > 0 ? static_cast<size_t>(n) : 0);
}

// "oom_kill N" of a /proc/vmstat-like file, or -1 (absent: kernels before 4.13, or unreadable).
int64_t oom_kills(const std::string& path) {
  std::ifstream f(path);
  std::string key;
  int64_t n = 0;
  while (f >> key >> n)
    if (key == "oom_kill") return n;
  return -1;
}

// A peer seen from this host: gone or not, and the signal that ended it when its exit code could
// be read (a zombie, dead and not yet reaped by mpirun's daemon: field 52 of /proc/PID/stat).
struct PeerState {
  bool gone = false;
  int signal = -1;
};

// The fields of /proc/PID/stat from the third (the state letter) on, after the command's closing
// parenthesis; "" when there is no such process.
std::string stat_fields(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  const size_t close = std::getline(stat, line) ? line.rfind(')') : std::string::npos;
  return close != std::string::npos && close + 2 < line.size() ? line.substr(close + 2) : std::string();
}

// 'R', 'S', 'T' (stopped), 'Z' (zombie), ..., or 0 when there is no such process.
char process_state(int pid) {
  const std::string f = stat_fields(pid);
  return f.empty() ? 0 : f[0];
}

PeerState peer_state(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return {true, -1};
  const std::string f = stat_fields(pid);
  if (f.empty()) return {true, -1};
  if (f[0] != 'Z' && f[0] != 'X') return {};
  std::istringstream rest(f);
  std::string field;
  for (int k = 3; k <= 52 && rest >> field; ++k)
    if (k == 52) {  // exit_code, as waitpid would give it
      const int code = std::atoi(field.c_str());
      return {true, (code & 0x7f) ? code & 0x7f : -1};
    }
  return {true, -1};
}

// --- the crash handler (async-signal-safe: write(2) of preformatted text and integers) ---

struct sigaction g_old[32];
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

void put(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w, n -= static_cast<size_t>(w);
  }
}

void put_int(int64_t v) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  const bool neg = v < 0;
  uint64_t u = neg ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
  do {
    buf[--i] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u && i > 1);
  if (neg) buf[--i] = '-';
  put(buf + i);
}

const char* fatal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
  }
}

extern "C" void on_fatal_signal(int sig) {
  const int saved = errno;
  put("pipefisher: rank ");
  put_int(g_rank.load());
  put(" (pid ");
  put_int(::getpid());
  put(") died of ");
  put(fatal_name(sig));
  if (g_running.load()) {
    put(" during step ");
    put_int(g_step.load() + 1);
  }
  put("; ");
  put(g_note_buf[g_note_cur.load()].data());
  put("\n");
  mark_reported();
  // The previous disposition (the default, or a sanitizer's) takes it from here.
  sigaction(sig, &g_old[sig], nullptr);
  errno = saved;
  raise(sig);
}

}  // namespace

RankMonitor::RankMonitor(const World& world, std::function<std::string()> checkpoint_note,
                         const std::string& oom_counter)
    : oom_counter_(oom_counter), oom_kills_at_start_(oom_kills(oom_counter)), rank_(world.rank()) {
  struct Id {
    int pid;
    char host[220];
  };
  Id mine{static_cast<int>(::getpid()), {}};
  const std::string host = host_identity();
  std::snprintf(mine.host, sizeof mine.host, "%s", host.c_str());
  std::vector<Id> all(static_cast<size_t>(world.size()));
  check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD),
        "MPI_Allgather(the ranks' pids)");
  for (int r = 0; r < world.size(); ++r)
    peers_.push_back({r, all[r].pid, std::strncmp(all[r].host, mine.host, sizeof mine.host) == 0 && !host.empty()});

  for (const Peer& p : peers_)
    if (p.local && p.rank != rank_) g_local_peers.emplace_back(p.rank, p.pid);
  g_rank.store(rank_);
  std::snprintf(g_marker.data(), g_marker.size(), "%s", marker_path(static_cast<int>(::getpid())).c_str());
  g_note_fn = new std::function<std::string()>(std::move(checkpoint_note));
  refresh_note();
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (int sig : kFatal) sigaction(sig, &sa, &g_old[sig]);
  if (world.size() > 1) thread_ = std::thread([this] { watch(); });
}

RankMonitor::~RankMonitor() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  for (int sig : kFatal) sigaction(sig, &g_old[sig], nullptr);
  g_local_peers.clear();
  delete g_note_fn;  // (the handler reads only the note buffers, which stay)
  g_note_fn = nullptr;
}

void RankMonitor::watch() {
  using namespace std::chrono_literals;
  std::vector<bool> reported(peers_.size(), false);
  while (!stop_.load()) {
    std::this_thread::sleep_for(50ms);
    if (!g_running.load()) continue;
    for (const Peer& p : peers_) {
      if (p.rank == rank_ || !p.local || reported[p.rank]) continue;
      const PeerState end = peer_state(p.pid);
      if (!end.gone) continue;
      // Not a rank leaving after an error every rank found: those leave the loop together.
      std::this_thread::sleep_for(250ms);
      if (stop_.load() || !g_running.load()) return;
      reported[p.rank] = true;
      // The lowest-ranked live rank of this host speaks.
      bool speaker = true;
      for (const Peer& q : peers_)
        if (q.rank < rank_ && q.local && q.rank != p.rank && !peer_state(q.pid).gone) speaker = false;
      if (!speaker) continue;
      if (::unlink(marker_path(p.pid).c_str()) == 0) continue;  // it said so itself
      report(p, end.signal);
    }
  }
}

void RankMonitor::report(const Peer& p, int signal) const {
  const std::string note = g_note_fn ? (*g_note_fn)() : std::string();
  const int64_t oom = oom_kills(oom_counter_);
  const int64_t step = g_step.load() + 1;
  std::string line;
  if (oom_kills_at_start_ >= 0 && oom > oom_kills_at_start_) {
    const int64_t n = oom - oom_kills_at_start_;
    line = fmt::format("pipefisher: rank {} (pid {}) was killed during step {} (signal 9, likely out of memory: the "
                       "kernel's out-of-memory killer ran {} since the run began); {}\n", p.rank, p.pid, step,
                       n == 1 ? std::string("once") : fmt::format("{} times", n), note);
  } else if (signal > 0) {
    const char* abbrev = sigabbrev_np(signal);
    line = fmt::format("pipefisher: rank {} (pid {}) was killed by signal {}{} during step {}; {}\n", p.rank, p.pid,
                       signal, abbrev ? fmt::format(" (SIG{})", abbrev) : "", step, note);
  } else {
    line = fmt::format("pipefisher: rank {} (pid {}) died during step {} without a word (a signal it cannot catch, "
                       "such as SIGKILL); {}\n", p.rank, p.pid, step, note);
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

StepsRunning::StepsRunning() { g_running.store(1); }
StepsRunning::~StepsRunning() { g_running.store(0); }

void monitor_step(int64_t step) { g_step.store(step); }

void checkpoint_written() { refresh_note(); }

std::string stopped_peers_note() {
  std::string note;
  for (const auto& [rank, pid] : g_local_peers) {
    const char state = process_state(pid);
    if (state == 'T' || state == 't')
      note += fmt::format("; rank {} (pid {}) is stopped (SIGSTOP or a debugger)", rank, pid);
  }
  return note;
}

void mark_reported() {
  if (!g_marker[0]) return;
  // Never through a link another user put in the shared directory.
  const int fd = ::open(g_marker.data(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

}  // namespace pf::comm
