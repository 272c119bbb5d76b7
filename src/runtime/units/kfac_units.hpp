#pragma once
// K-FAC's units on one rank (runtime/README.md): the K-FAC service of each hosted chunk's stage
// group (kfac_service.hpp), made on the chunk's record; the handlers the executor's dispatch table
// calls (kfac_handlers.hpp), each sent to its chunk's service; and what the rank reports of them.
// Which list a step runs and what each PREC does is the placement's (runtime/kfac_placement.hpp):
// it tells each service at step start.
#include "comm/perf_model.hpp"
#include "comm/world.hpp"
#include "config/config.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "io/checkpoint.hpp"
#include "runtime/action_time.hpp"
#include "runtime/hosted_chunk.hpp"
#include "runtime/kfac_handlers.hpp"
#include "runtime/layout.hpp"
#include "runtime/units/chunk_kfac.hpp"
#include "runtime/units/kfac_service.hpp"

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace pf {

class KfacUnits final : public KfacHandlers {
 public:
  // Collective (communicators; with DistributedKfacs, the comm perf model): a service on each of
  // the executor's chunk records, refreshing as the placement does (`refresh`).
  KfacUnits(const Config& cfg, const Layout& layout, const comm::Groups& groups, HostedChunks& chunks,
            KfacService::Refresh refresh);
  ~KfacUnits() override;

  // The chunk records (the executor's), each with its service; service(p, s) through their lookup.
  const HostedChunks& hosted() const { return chunks_; }
  KfacService& service(int pipeline, int stage) const { return *chunks_.at(pipeline, stage).kfac; }
  KfacPreconditioner* preconditioner(int pipeline, int stage) { return &service(pipeline, stage).chunk().pre(); }
  // Step start (the placement calls it before configuring the records).
  void begin_step(int64_t step);
  // The comm performance model, measured once over this rank's first stage's holders (the same
  // communicator for both devices of a Chimera pair) or read from the per-machine cache.
  // Collective over those holders.
  const comm::PerfModel& perf_model();

  // KfacHandlers.
  void curvature(const Action& a) override;
  void curvature_sync(const Action& a) override;
  void inversion(const Action& a) override;
  void inverse_broadcast(const Action& a) override;
  void precondition(const Action& a) override;
  void skip_inputs(int pipeline, int stage, bool on) override;
  void before_gradient_norm(double lr) override;
  double raw_grad_sq(int pipeline, int stage, double sq) const override;
  void discard_step() override;
  KfacWork work() const override { return work_; }
  int64_t tap_ns() const override;
  // BCAST_INV's sender: world rank of the holder that inverted the piece (the plan knows it).
  using Inverter = std::function<int(const Action&)>;
  void set_inverter(Inverter f) { inverter_ = std::move(f); }

  // Reports (kfac_units_reports.cpp).
  // This rank's K-FAC layers: (pipeline, stage, layer within the stage, the layer's name).
  std::vector<std::tuple<int, int, int, std::string>> layer_names() const;
  // For the profiler: the step's list and stamps with each PREC that ran an inline refresh
  // replaced by the refresh's units as they ran, then the PREC itself from the last unit's end.
  void expand_inline_units(std::vector<Action>& actions, std::vector<ActionTime>& times) const;
  // With DistributedKfacs (inline / skip, several copies per stage): one line for the start of
  // the run (strategy, factors, inverses broadcast, perf model measured or cached), "" otherwise.
  std::string distributed_line() const;
  // Collective, no-op without DistributedKfacs: rank 0 writes `path` (dkfac.json).
  void write_dkfac_record(const std::string& path, double step_time_sum, int timed_steps);
  // Collective: rank 0 writes the refresh record (kfac/refresh_record.hpp) of `steps` steps.
  void write_refresh_record(const std::string& path, int64_t steps, int64_t plan_start, int period);

  // Checkpoints (kfac_units_state.cpp): every service's ChunkKfac (tensors named under `prefix`,
  // one per chunk) and DistributedKfac. load_state after the placement's (whose plan sets the
  // precondition splits).
  nlohmann::json save_state(int rank, NamedTensors& tensors) const;
  void load_state(const CheckpointReader& r, int rank, const nlohmann::json& chunks, const nlohmann::json* distributed);

 private:
  void connect_in_stage_order();
  void share_whole_refreshes();
  void precondition(KfacService& k);
  void kl_clip(double lr);

  const Config& cfg_;
  const Layout& layout_;
  const comm::Groups& groups_;
  HostedChunks& chunks_;
  std::optional<comm::PerfModel> perf_;
  Inverter inverter_;
  int64_t step_ = 0;
  KfacWork work_;
};

}  // namespace pf
