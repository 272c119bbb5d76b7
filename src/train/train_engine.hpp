#pragma once
// What the training loop (train/train_loop.hpp) asks of the processes that train: one process
// holding the whole model (train/one_process.hpp), or every rank of an MPI job holding its stages
// (train/mpi_run.cpp). The loop owns the rest: the order of the set-up, non-finite steps, stop
// signals, the evaluation and checkpoint cadence, the logs, the checkpoints' manifests and the
// final outputs. Calls marked collective are made by every process, in the same order.
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "plan/plan_summary.hpp"
#include "train/trainer.hpp"

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pf {

struct EngineStep {
  StepStats stats;          // nonfinite: the loss or gradient norm was NaN/Inf, nothing was updated
  std::string write_error;  // the root could not write this step's records (the profiler's): the run stops
};

// The root's share of the final outputs (empty elsewhere).
struct FinalRecords {
  std::vector<const Param*> params;                          // the whole model (pipeline 0 of replica 0)
  std::vector<std::pair<std::string, std::string>> files;    // more files for out_dir: (name, text)
  std::vector<std::string> listed;                           // what the "outputs:" line adds to the common files
  std::string write_error;                                   // a record the engine could not write
  std::optional<PlanSummary> plan;                           // PipeFisher's plan at the end, for summary.json
};

// The lines that open a run, after its model and batch: the layout, and notes of the engine.
struct EngineBanner {
  std::string layout;              // appended to the first line ("; 2 ranks: 2 stages (1f1b) x 1 data-parallel")
  std::vector<std::string> notes;  // lines after it
  // The model's parameters by stage (model chunk), pipeline 0 of replica 0; one entry in one
  // process; empty where the stages are not built (a dry run without mpirun).
  std::vector<int64_t> stage_parameters;
};

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;

  // --- the processes (one process: trivially) ---
  virtual bool root() const { return true; }  // writes the run's files and prints its lines
  // Collective: fn on the root; a UsageError it throws is thrown on every process.
  virtual void on_root(const std::function<void()>& fn) { fn(); }
  // Collective: sums over the processes, in place.
  virtual void sum(std::span<double> values) {}
  // Collective: every process's bytes at the root, in rank order (empty elsewhere).
  virtual std::vector<std::string> gather(const std::string& mine) { return {mine}; }
  // The loop's steps are running from here until false (a death is reported meanwhile).
  virtual void steps_running(bool on) {}
  virtual void checkpoint_written() {}

  // --- set-up ---
  // Recorded in each checkpoint's manifest ("1 process", "2 stages (1f1b) x 1 data-parallel").
  virtual std::string layout_name() const = 0;
  // False for --dry-run in one process of a layout of several ranks (no mpirun): the processes
  // that would build and load the stages are not there, so build and the loads are not called.
  virtual bool builds_here() const { return true; }
  // Collective: the model, optimizer and data of the resolved configuration; reads the token
  // files (a bad one is refused here). Allocates, writes nothing.
  virtual void build(const Config& cfg) = 0;
  // Collective: --init's weights, a checkpoint's state; a UsageError (a shape that differs) is
  // thrown on every process. After load_resume the next step is the checkpoint's step.
  virtual void load_init(const std::string& init, const CheckpointReader* ckpt) = 0;
  virtual void load_resume(const CheckpointReader& r) = 0;
  // Collective, after the run's outputs are open: what the engine writes besides (--profile-dir).
  virtual void open_outputs() {}
  virtual EngineBanner banner() const = 0;

  // --- the run ---
  virtual EngineStep step(int64_t step) = 0;  // collective: step index `step`, from 0
  // Collective: the validation loss, on every process; nothing when `stopped` (a stop signal) was
  // true on any process before one of its micro-batches: the evaluation ends there, within one.
  virtual std::optional<double> evaluate(const StopAsked& stopped) = 0;
  // Writes this process's checkpoint files into step_dir (made by the root); UsageError on a full disk.
  virtual std::vector<CheckpointFile> write_checkpoint(const std::string& step_dir) = 0;
  // Collective, after the last step: the final weights and the engine's records (out_dir).
  virtual FinalRecords finish(const std::string& out_dir) = 0;
};

}  // namespace pf
