#include "core/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace pf {

std::string clock_time(double seconds) {
  const auto t = static_cast<long long>(seconds + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02d}", t / 60, t % 60);
}

ProgressLine::ProgressLine(std::string what, int total)
    : what_(std::move(what)), total_(total), tty_(isatty(fileno(stderr)) != 0) {}

ProgressLine::~ProgressLine() {
  if (tty_) std::fputs("\r\033[K", stderr);
}

void ProgressLine::update(int done) {
  if (!tty_ || done <= 0) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = elapsed / done * (total_ - done);
  std::fprintf(stderr, "\r%s %d/%d | %s elapsed, ETA %s\033[K", what_.c_str(), done, total_, clock_time(elapsed).c_str(),
               clock_time(eta).c_str());
  std::fflush(stderr);
}

}  // namespace pf
