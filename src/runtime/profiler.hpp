#pragma once
// The runtime's profiler: the start and end of every action on every rank for chosen steps.
//
// Each rank stamps its actions with its own steady clock (Executor::run); at the end of a
// profiled step the stamps are gathered to world rank 0, moved onto rank 0's clock with the
// offsets comm::estimate_clock_offsets measured at start-up, and turned into the simulator's
// Timeline type (one row per rank), so the same renderers draw it:
//   DIR/timeline-step<k>.svg   the SVG timeline `pipefisher plan --svg` draws, measured
// and when training ends
//   DIR/trace.json             Chrome trace-event JSON (Perfetto) of every profiled step, each on
//                              the "steps" track, K-FAC units named by their layer's name
//   DIR/profile.json           the project's profile format (sim/profile.hpp): mean forward and
//                              backward (I and W for zero-bubble) per stage per micro-batch, the
//                              optimizer per stage (the stage of a device's first OPT also
//                              carries finishing the gradients: all-reduce waits, the word-embedding
//                              sum and the norm, as long as the last rank to arrive waited), the
//                              point-to-point latency (median delay from
//                              a send's start to the end of a receive that was already waiting),
//                              the all-reduce wait as alpha; plus a "measured" object: step time,
//                              utilization and communication wait per rank, and the step time the
//                              simulator predicts from this very profile; the "run" (schedule,
//                              D, N, W, V, model, K-FAC placement) and each stage's memory: what
//                              a micro-batch holds (M_act, and M_W with a split backward) as the
//                              executor holds it (ActivationMemory), the rest from the model's
//                              shapes (sim/memory.hpp); with PipeFisher, each stage's
//                              K-FAC units as planned ("kfac_layers", "precondition", "sync") and
//                              the "pipefisher_plan" its plan was made from (runtime/plan_record.hpp).
// In trace.json an action of a planned PipeFisher step carries args planned_start / planned_end
// (ms from the step's start on the plan's clock): `pipefisher report --account` reads them.
// `pipefisher plan --profile DIR/profile.json` then predicts the same run (no other flag), or any
// schedule from measured costs.
// Steps are numbered from 1 as the log prints them.
#include "comm/clock.hpp"
#include "comm/world.hpp"
#include "runtime/executor.hpp"
#include "runtime/layout.hpp"
#include "sim/sim.hpp"
#include "viz/render.hpp"

#include <nlohmann/json_fwd.hpp>

#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace pf {

struct PlanProfile;  // sim/profile.hpp

struct ProfileOptions {
  std::string dir;        // empty = off
  std::set<int> steps;    // 1-based; empty = every step but the first (warm-up)
};

// What one profiled step looked like, on rank 0's clock, times in ms from the step's first action.
// --profile-steps within the run's steps 1..total_steps (when profiling); UsageError otherwise.
void check_profile_steps(const ProfileOptions& opt, int total_steps);

struct MeasuredStep {
  int step = 0;                     // 1-based
  double start = 0;                 // ms from the first profiled step's start
  Timeline timeline;                // one row per world rank
  std::vector<double> comm_wait;    // [rank] ms spent waiting for messages and collectives
  // [rank] the plan's timeline of the step (KfacPlacement::planned_row; empty: no plan), carried
  // into trace.json as each action's planned_start / planned_end.
  std::vector<std::vector<TimedAction>> planned;
};

struct StepSummary;  // the profiled steps' times, averaged (profiler.cpp)

// One stage's sizes in bytes, from the rank that hosts it: its gradients, and per micro-batch
// what a forward keeps for the backward and what a split backward's I keeps for W.
struct StageBytes {
  int64_t params = 0, state = 0, deferred = 0;
};

class Profiler {
 public:
  // A K-FAC layer of this rank: (pipeline, stage, layer within the stage, its name).
  using KfacLayerNames = std::vector<std::tuple<int, int, int, std::string>>;
  // Collective (estimates the clock offsets) when profiling is on. kfac_layers: KfacUnits::layer_names.
  Profiler(const Config& cfg, const Layout& layout, const comm::Groups& groups, const Executor& exec,
           const KfacLayerNames& kfac_layers, ProfileOptions opt);
  bool enabled() const { return !opt_.dir.empty(); }
  bool wants(int64_t step) const;  // 0-based step index
  // Collective: gathers the step's action times to rank 0, which writes its SVG and trace.
  void record(int64_t step, const std::vector<ActionTime>& times);
  // The same for a step whose action list is not the lowered schedule (K-FAC units inserted);
  // `planned`: the plan's timeline of this rank's step (KfacPlacement::planned_row), or empty.
  void record(int64_t step, const std::vector<ActionTime>& times, const std::vector<Action>& actions,
              const std::vector<TimedAction>& planned = {});
  // Rank 0: writes profile.json and trace.json and prints one summary line. Call after the last
  // step. plan: the profile the PipeFisher plan was made from (KfacPlacement::plan_profile), carried
  // into profile.json so that kfac.plan_profile can name it; null for none.
  void finish(const PlanProfile* plan);

 private:
  // The parts of finish(): one stage's profile.json entry, the whole file's fields, and trace.json.
  nlohmann::json stage_json(int s, const StageCost& c, bool split_backward) const;
  nlohmann::json profile_json(const nlohmann::json& stages, const CostModel& cost, const StepSummary& summary,
                              size_t p2p_samples, const Timeline& predicted) const;
  void write_trace() const;

  Config cfg_;
  const Layout& layout_;
  const comm::Groups& groups_;
  ProfileOptions opt_;
  int total_steps_ = 0;
  comm::ClockOffsets offsets_;
  std::vector<StageBytes> stage_bytes_;  // [stage]
  LayerNames layer_names_;            // rank 0: every rank's K-FAC layers
  int64_t origin_ns_ = -1;            // rank 0's clock at the first profiled step's start
  std::vector<MeasuredStep> measured_;
  // Raw per-rank stamps of the measured steps (rank 0), for per-action statistics.
  std::vector<std::vector<std::vector<ActionTime>>> raw_;  // [profiled step][rank][action]
};

// The Timeline for one step from each rank's stamps (already on one clock): the basis of the
// profiler's files; exposed for tests.
Timeline measured_timeline(const Layout& layout, const std::vector<std::vector<ActionTime>>& per_rank);
// With each rank's own action list of the step ([rank]).
Timeline measured_timeline(const std::vector<std::vector<Action>>& actions,
                           const std::vector<std::vector<ActionTime>>& per_rank);

// Chimera is ordered for parallel.backward_forward_ratio before anything is measured: when the
// measured T_b / T_f (summed over the stages of `cost`) gives another order, a one-line note
// saying which value gives it; "" otherwise (and for other schedules).
std::string chimera_order_note(const Config& cfg, int devices, int micro_batches, const CostModel& cost);

}  // namespace pf
