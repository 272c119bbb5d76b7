#pragma once
// Progress of long work, as training's status line shows it: on a terminal (stderr) one line
// rewritten in place, "what 12/40 | 0:03 elapsed, ETA 0:07", erased when the work is done; nothing
// when stderr is not a terminal (a log or a pipe wants results, not a line per item).
#include <chrono>
#include <string>

namespace pf {

// 75 -> "1:15", 3725 -> "1:02:05".
std::string clock_time(double seconds);

class ProgressLine {
 public:
  ProgressLine(std::string what, int total);
  ~ProgressLine();  // erases the line
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  void update(int done);  // `done` of `total` items are finished

 private:
  std::string what_;
  int total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace pf
