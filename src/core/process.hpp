#pragma once
// Running another program: through its argument vector, found on PATH as execvp finds it; never
// through a shell, so no file or directory name is ever read as a command.
#include <string>
#include <vector>

namespace pf {

struct ProgramResult {
  bool started = false;  // false: not found on PATH, or not executable
  int exit_status = -1;  // its exit status; -1 when a signal ended it
};

// Runs argv[0] with the arguments argv[1..] and waits for it. `stdout_fd` >= 0: its standard
// output goes there (its standard error stays ours).
ProgramResult run_program(const std::vector<std::string>& argv, int stdout_fd = -1);

}  // namespace pf
