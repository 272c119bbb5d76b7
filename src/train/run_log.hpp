#pragma once
// What a training run reports: a status line on a terminal (or a line per log_every steps when
// the output is not a terminal) with elapsed time and ETA, one record per step in the log files,
// and a summary.
//
// Step records: one JSON object per line in out_dir/log.jsonl (and train.log_json), the same
// fields as a CSV row in out_dir/metrics.csv (spreadsheets, pandas, gnuplot):
//   step, time (UTC, ISO 8601), elapsed_s (training seconds since the run's first step, resumed
//   segments continuing the count), loss, valid_loss (steps that evaluated), lr, grad_norm (the
//   loss gradient's global norm, before K-FAC and clipping: comparable across optimizers),
//   tokens, step_time_s, tokens_per_s, model_flops_per_token, flops_per_s (model FLOPs per second
//   achieved: the two before multiplied), mfu (flops_per_s over the peak of the job's processes),
//   peak_rss_bytes (each rank's peak resident set so far; in CSV the ranks' values separated by
//   spaces), and with K-FAC precond_grad_norm (after the precondition:
//   what clipping sees), kfac_curvature / kfac_inversion (this step did curvature / inversion work: a refresh, or in
//   PipeFisher's bubbles a part of one), kfac_damping_raised (factors whose inversion needed more
//   damping; one process only, empty under MPI) and kfac_time_s (the step's K-FAC work: in one
//   process commit, inversions, preconditioning and KL clip after the backward; under MPI the
//   K-FAC actions' seconds summed over the ranks). A run whose stages share K-FAC among their
//   copies (kfac.distributed: inline / skip with replicas or Chimera) adds dkfac.json.
//
// A resumed run (--resume into the same out_dir) keeps the records of steps 1..k of the files it
// finds (dropping those a killed segment wrote past its checkpoint at step k) and appends, so the
// logs hold each step once and the summary covers the whole run.
#include "core/files.hpp"
#include "core/machine.hpp"
#include "core/peak_flops.hpp"
#include "plan/plan_summary.hpp"
#include "train/trainer.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pf {

// The run's memory, for the summary: each rank's peak resident set and the part of it that maps
// files (core/machine.hpp), and the memory check's estimate of the whole job's peak (config/limits.hpp).
struct MemoryUse {
  std::vector<double> peak_rss;  // bytes, by world rank
  std::vector<double> file_rss;  // bytes, by world rank, at the end
  double estimate = 0;           // bytes, every rank together
};

// How well the run uses the machine: model FLOPs per token (nn/flops.hpp) times tokens per
// second, over the peak of the job's processes (processes x one process's sgemm peak,
// core/peak_flops.hpp: each rank is assumed to have its threads' cores to itself).
struct Throughput {
  double model_flops_per_token = 0;
  PeakFlops peak;  // one process's
  double flops_per_s(double tokens_per_s) const { return model_flops_per_token * tokens_per_s; }
  double mfu(double tokens_per_s, size_t processes) const {
    return peak.flops_per_s > 0 ? flops_per_s(tokens_per_s) / (static_cast<double>(processes) * peak.flops_per_s) : 0.0;
  }
};

// "parameters: 4,386,178 (stage 0: 2,193,664, stage 1: 2,192,514)", as a run's start prints them;
// the stages' part under a pipeline only; "" when none were counted.
std::string parameters_line(const std::vector<int64_t>& stage_parameters);

// What a run ends with: summary.json's text, and the line printed last.
struct RunSummary {
  std::string json;
  std::string line;
};

struct RunLogOptions {
  int total_steps = 0;
  int log_every = 1;
  bool kfac = false;              // records carry the K-FAC fields
  int64_t resume_step = -1;       // >= 0: continue the files' records after this step
  Throughput throughput;
};

class RunLog {
 public:
  // `json` files receive JSON lines, `csv` (if its path is not empty) CSV rows; opened now
  // (truncated, or filtered and appended to on resume) under core/files.hpp's rule. A file the
  // user named that is not a regular file (/dev/stdout, a FIFO, a link) is appended to where it is,
  // and never read back on resume.
  RunLog(const RunLogOptions& o, std::vector<OutputFile> json, OutputFile csv);
  ~RunLog();
  // UsageError naming the file when a log line cannot be written (full disk). `peak_rss`: each
  // rank's peak resident set so far, by world rank.
  void step(const StepStats& s, std::optional<double> valid_loss, const std::vector<double>& peak_rss);
  // The final summary. The counts and times cover the whole run: wall_s is this segment's,
  // earlier ones' are added.
  // `stage_parameters`: the model's parameters by stage (train_engine.hpp's EngineBanner).
  // `plan`: PipeFisher's plan at the end (summary.json's "pipefisher_plan"), if the run had one.
  RunSummary summary(double final_valid_loss, double wall_s, const MemoryUse& memory,
                     const std::vector<int64_t>& stage_parameters, const std::optional<PlanSummary>& plan = {}) const;

  double first_loss() const { return first_loss_; }
  double last_loss() const { return last_loss_; }

 private:
  struct File {
    OutputFile out;
    FILE* f = nullptr;
    bool csv = false;
  };
  void open(File& file);  // truncates, or on resume keeps the records up to resume_step
  void count_previous(const std::string& json_line);
  std::string status_text(const StepStats& s, double tokens_per_s, double mfu, double segment_s) const;
  void print_status(const std::string& text, std::optional<double> valid_loss, bool last, int64_t step) const;

  RunLogOptions o_;
  bool tty_;
  MachineInfo machine_;  // as the run began
  std::vector<File> files_;
  double first_loss_ = 0, last_loss_ = 0, tokens_ = 0, busy_s_ = 0;
  double elapsed_before_ = 0;  // training seconds of the run's earlier segments
  int64_t steps_ = 0, segment_steps_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Makes train.out_dir, writes the resolved config.toml there and opens the step logs
// (out_dir/log.jsonl and metrics.csv, and train.log_json when set). Every training path starts
// its outputs here (and warns about settings that are probably not meant, config_warnings);
// `resume_step` >= 0 continues a run's logs after that step; `kfac_metrics`:
// the caller fills StepStats' K-FAC fields (the single-process trainer does).
std::unique_ptr<RunLog> open_run_outputs(const Config& cfg, int64_t resume_step = -1, bool kfac_metrics = false);

}  // namespace pf
