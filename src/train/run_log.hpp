#pragma once
// What a training run reports: a status line on a terminal (or a line per log_every steps when
// the output is not a terminal), one JSON object per step in the log files, and a summary.
#include "core/machine.hpp"
#include "train/trainer.hpp"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pf {

class RunLog {
 public:
  // `json_paths`: files that receive one JSON object per step (opened now, truncated).
  RunLog(int total_steps, int log_every, std::vector<std::string> json_paths);
  ~RunLog();
  void step(const StepStats& s, std::optional<double> valid_loss);
  // Prints the final summary and returns it as a JSON object (written to summary.json).
  std::string summary(double final_valid_loss, double wall_s) const;

  double first_loss() const { return first_loss_; }
  double last_loss() const { return last_loss_; }

 private:
  int total_, every_;
  bool tty_;
  MachineInfo machine_;  // as the run began
  std::vector<FILE*> json_;
  double first_loss_ = 0, last_loss_ = 0, tokens_ = 0, busy_s_ = 0;
  int64_t steps_ = 0;
};

// Makes train.out_dir, writes the resolved config.toml there and opens the step logs
// (out_dir/log.jsonl, and train.log_json when set). Every training path starts its outputs here.
std::unique_ptr<RunLog> open_run_outputs(const Config& cfg);

}  // namespace pf
