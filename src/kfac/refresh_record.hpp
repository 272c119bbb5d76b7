#pragma once
// The refresh record of a K-FAC run: from which step each factor's inverse (or inverse block) is
// used, built from which step's micro-batches, with pi from which step's other factor. A
// PipeFisher run (kfac.placement = bubbles) writes it as out_dir/kfac_refresh.json; a single
// process follows it (kfac.placement = replay, train/kfac_replay.hpp) and trains what the
// pipeline trained, so a PipeFisher configuration's convergence can be predicted on one machine.
//
// The file (JSON):
//   {"format": "pipefisher-refresh", "version": 1,
//    "steps": N,            the recording run's steps: its events before step N are complete
//    "plan_start": S,       the first step of the plan (the steps before it profiled, inline)
//    "period": P,           the plan's period: lcm of the devices' refresh cycles (0: no plan)
//    "recorded_with": {"model.hidden": 256, ...},   what the pattern is valid for (record_shape)
//    "layout": {"parallel.stages": 2, "parallel.schedule": "1f1b", ...},   for the reader only
//    "events": [{layer, side, block, use_step, curv_step, pi_step}], "splits": [{layer, side, blocks, from_step}]}
// Past step N the pattern repeats with period P: step u uses what step u - kP of the record's last
// period [N - P, N) used, every step number shifted by kP. A record whose last two periods differ
// (a re-planned run, or too short to show a steady cycle) cannot be extended (RefreshPattern).
#include "config/config.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pf {

// Which inverse a precondition uses: built from the factor of step curv_step, pi from the other
// side's factor of step pi_step (-1 = none committed: pi = 1).
struct InverseId {
  int64_t curv_step = -1, pi_step = -1;
  friend bool operator==(const InverseId&, const InverseId&) = default;
};

// One change: from step use_step on, (layer, side, block) uses inverse `id`. block -1 = whole.
struct RefreshEvent {
  std::string layer;
  int side = 0;  // 0 = A, 1 = B
  int block = -1;
  int64_t use_step = 0;
  InverseId id;
  friend bool operator==(const RefreshEvent&, const RefreshEvent&) = default;
};
// A factor switched to `blocks` diagonal blocks before step from_step.
struct SplitEvent {
  std::string layer;
  int side = 0;
  int blocks = 1;
  int64_t from_step = 0;
  friend bool operator==(const SplitEvent&, const SplitEvent&) = default;
};

struct RefreshRecord {
  std::string path;  // the file it was read from (messages)
  int64_t steps = 0;
  int64_t plan_start = 0;
  int period = 0;
  std::map<std::string, std::string> recorded_with;  // config key -> its value as TOML text
  std::map<std::string, std::string> layout;         // the recording run's layout (printed, not checked)
  std::vector<RefreshEvent> events;                  // by use_step, then layer, side, block
  std::vector<SplitEvent> splits;                    // by from_step
};

// The keys a refresh pattern depends on beyond the plan: the model's K-FAC layers and their
// shapes, the global batch (micro-batches x sequences: curvature is built from all of a step's),
// and which factors are diagonal. Values as Config::value_text prints them.
std::map<std::string, std::string> record_shape(const Config& cfg);
// The layout keys of the recording run (stages, schedule, replicas, virtual stages).
std::map<std::string, std::string> record_layout(const Config& cfg);

// Sorts events and splits (the file's order) and writes the record whole (core/files.hpp).
void write_refresh_record(RefreshRecord rec, const std::string& path);
// Reads a record; UsageError naming `key` (kfac.refresh_record) for a file that is not one.
RefreshRecord read_refresh_record(const std::string& path, const std::string& key);
// UsageError naming the first key of record_shape(cfg) whose value differs from the record's
// (`key`: the key that names the record, kfac.refresh_record).
void check_record_fits(const RefreshRecord& rec, const Config& cfg, const std::string& key);

// A record's pattern over a run of `steps` steps: the record's own events before its end, then its
// last period repeated. Refuses (UsageError naming `key`) a record it cannot extend that far: no
// plan (period 0), or last two periods that differ (the plan changed, or the run was too short to
// reach a steady cycle: record more steps).
class RefreshPattern {
 public:
  RefreshPattern(const RefreshRecord& rec, int64_t steps, const std::string& key);

  // The changes that take effect at `step` (use_step == step), in the record's order.
  const std::vector<RefreshEvent>& events_at(int64_t step) const;
  // The factors re-partitioned before `step`.
  const std::vector<SplitEvent>& splits_at(int64_t step) const;
  // Whether the factors of `layer` built from step `step`'s micro-batches are used (as an
  // inverse's curvature or as its pi), so the step must accumulate them.
  bool builds(const std::string& layer, int64_t step) const;
  // The most steps between a factor's curvature (or pi) step and the last step that uses it.
  int64_t max_lag() const { return max_lag_; }
  int64_t steps() const { return static_cast<int64_t>(events_.size()); }

 private:
  std::vector<std::vector<RefreshEvent>> events_;  // [step]
  std::vector<std::vector<SplitEvent>> splits_;    // [step]
  std::vector<std::vector<std::string>> builds_;   // [step] layers whose factors of that step are used, sorted
  int64_t max_lag_ = 0;
};

}  // namespace pf
