#pragma once
// Profiles: measured durations and memory that set the simulator's costs.
//
// 1. The CSV published with the paper's code, one transformer block per row, times in ms,
//    memory in MB:
//      bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron
//    The row with bs = micro-batch size is used; every value is multiplied by the number of
//    blocks per stage ("doubling the number of layers per stage doubles all times and memories").
//
// 2. The project's profile JSON, written by the runtime (times in ms, memory in MB, bytes in
//    bytes; every stage measured separately, so non-uniform stages are represented):
//    {
//      "format": "pipefisher-profile",       required
//      "version": 1,                          required
//      "micro_batch_size": 32,                required
//      "stages": [                            required, one object per stage, in stage order
//        { "forward": 10.4, "backward": 16.3, required
//          "input_grad": 8.2, "weight_grad": 8.1,            optional (zero-bubble split)
//          "curvature": 27.5, "inversion": 80.9, "precondition": 8.9, "optimizer": 0.4,
//          "layers": 3,                                       K-FAC layers of the stage
//          "mem_param": 85, "mem_act": 120, "mem_peak_err": 40, "mem_save_err": 30, "mem_kron": 168,
//          "mem_deferred": 30,                                M_W (split backward; optional)
//          "activation_bytes": 1572864, "grad_bytes": 340000000, "curvature_bytes": 176000000 } ],
//      "p2p": { "latency": 0.02, "bandwidth": 1.0e7 },        optional, ms and bytes per ms
//      "allreduce": { "alpha": 0.05, "beta": 1.0e-8 },         optional, ms and ms per byte
//      "run": {                                                optional: the run that measured it
//        "schedule": "1f1b", "devices": 2, "virtual_stages": 1, "micro_batches": 4, "replicas": 1,
//        "model": "bert-mini", "kfac": "bubbles", "recompute": false },  kfac: off | inline | skip | bubbles
//    }
//    and per stage, optional, the K-FAC units as measured (ms; one micro-batch for curvature):
//          "kfac_layers": [ { "name": "bert.encoder.layer.0.attention.self.query", "d_in": 256,
//                             "d_out": 256, "curvature_a": 0.1, "curvature_b": 0.1,
//                             "inversion_a": 1.2, "inversion_b": 1.2, "diagonal_b": false } ],
//          "sync": 0.3                                        curvature all-reduce (W > 1)
//    and "broadcast": { "alpha": 3.5, "beta": 0 }, the run's broadcast model (W > 1 or Chimera).
//    A PipeFisher run adds what its planner took exactly (the stages' K-FAC units above, as the
//    mean over each stage's holders, and the broadcast model):
//      "pipefisher_plan": { "shape": {...},               the configuration it was measured for
//                           "action_ms": [[1.2, 0, ...], ...] },  [device][index in its lowered list]
//    (out_dir/kfac_profile.json is such a profile; kfac.plan_profile reads either file).
//    Files without "run" but with the runtime's "measured" object take the shape from there.
//    Optional numbers default to 0 (input_grad / weight_grad: half the backward). Every number
//    is finite and >= 0, times at most 2^53 us (in ms), the others at most 2^53; micro_batch_size
//    and layers are integers >= 1 (sim/limits.hpp).
#include "sim/cost.hpp"
#include "sim/kfac_cost.hpp"
#include "sim/memory.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace pf {

// The paper's CSV profiles are one block at this sequence length (data/profiles/README.md).
constexpr int kPaperProfileSeqLen = 128;

struct ProfileRow {
  int bs = 0;
  double time_f = 0, time_b = 0, time_kron = 0, time_inv = 0, time_prec = 0;
  double mem_param = 0, mem_act = 0, mem_peak_err = 0, mem_save_err = 0, mem_kron = 0;
};

// The shape of the run that wrote a profile (`pipefisher plan --profile FILE` predicts it).
struct ProfileRun {
  std::string schedule;
  int devices = 0, virtual_stages = 1, micro_batches = 0, replicas = 1;
  std::string model;         // preset, "" if unknown
  std::string kfac = "off";  // off | inline | skip | bubbles
  bool recompute = false;    // parallel.recompute: its backward times include the re-run forward
  double step_time = 0;      // measured mean step, ms (0: not measured)
};

// What the PipeFisher planner takes from a profile. From a run (the runtime's planning input,
// its "pipefisher_plan"), exactly what that run's plan was made from: the doubles round-trip
// through the JSON form bit for bit.
struct PlanProfile {
  std::vector<StageKfacCost> kfac;  // [stage] measured K-FAC units (mean over the stage's holders); empty: none
  // "broadcast": the run's model of an inverse's broadcast among a stage's holders (ms, ms per
  // byte; W > 1 or Chimera), which its plan used; < 0: none.
  double bcast_alpha = -1, bcast_beta = -1;
  nlohmann::json shape;  // the configuration action_ms belongs to (runtime/plan_record.hpp); null: none
  std::vector<std::vector<double>> action_ms;  // [device][index in its lowered list] ms; empty: none
  bool operator==(const PlanProfile&) const = default;
};

// `p` with made-up costs that no machine's timings change (tests: --test-fixed-costs): every
// action 1 ms; per unit curvature and SOAP statistics 0.05 ms, inversion and basis refresh 0.3 ms;
// precondition and sync 0.1 ms per stage; a broadcast (where modelled) free. Its shape stays.
PlanProfile with_fixed_costs(PlanProfile p);

struct Profile {
  int micro_batch_size = 0;
  CostModel cost;
  std::vector<StageMemory> memory;  // one entry per stage, or one for uniform stages
  std::optional<ProfileRun> run;
  PlanProfile plan;
  std::vector<std::vector<std::string>> layer_names;  // [stage][layer] of plan.kfac
};

// Throws UsageError naming `flag` (e.g. "--profile") on a missing or malformed file.
std::vector<ProfileRow> read_paper_csv(const std::string& path, const std::string& flag = "--profile");
Profile profile_from_row(const ProfileRow& row, int layers_per_stage);
// A per-block profile (one uniform stage of one transformer block, as the paper's CSV rows are)
// as stages of blocks[s] blocks each: every time, byte count and memory of stage s times blocks[s]
// (the stage-to-stage message stays one block's).
Profile with_stage_blocks(const Profile& per_block, const std::vector<int>& blocks);
Profile read_profile_json(const std::string& path, const std::string& flag = "--profile");
// The same from parsed JSON; errors name `where`.
Profile read_profile(const nlohmann::json& j, const std::string& where);

// The writer of a profile's K-FAC part: into `profile` (whose "stages" has one object per stage
// of p.kfac) each stage's "kfac_layers" (named by names[stage][layer] where given), "layers",
// "curvature", "inversion", "precondition" and "sync"; "broadcast" when p has one;
// "pipefisher_plan" when p has action times.
void add_plan_profile(nlohmann::json& profile, const PlanProfile& p,
                      const std::vector<std::vector<std::string>>& names = {});

}  // namespace pf
