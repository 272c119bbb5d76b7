#pragma once
// The refresh record of a SOAP run whose eigenbasis refreshes ran as units (precond.placement =
// bubbles: runtime/soap/soap_placement.hpp): which factor of which weight was refreshed before
// which step's update. A single process follows it (precond.placement = replay with optim.name =
// soap: train/soap_replay.hpp) and so trains what the pipeline trained.
//
// The file (JSON), out_dir/soap_refresh.json:
//   {"format": "pipefisher-soap-refresh", "version": 1,
//    "steps": N,           the recording run's steps: its refreshes before step N are all here
//    "plan_start": S,      the plan's first step (the steps before it profiled: no basis moved)
//    "period": P,          the plan's refresh period (lcm of the devices' cycles)
//    "refreshes": [{"step": t, "weight": "encoder.0.attn.q.weight", "side": "L"}, ...]}
// sorted by step, weight, side ("L" the statistic G G^T of the output side, "R" G^T G).
#include <cstdint>
#include <string>
#include <vector>

namespace pf {

struct SoapRefresh {
  int64_t step = 0;  // refreshed before this step's update (0-based training step)
  std::string weight;
  int side = 0;  // 0: L, 1: R
  friend auto operator<=>(const SoapRefresh&, const SoapRefresh&) = default;
};

struct SoapRefreshRecord {
  int64_t steps = 0, plan_start = 0;
  int period = 0;
  std::vector<SoapRefresh> refreshes;
};

// Sorts the refreshes (the file's order) and writes the record whole (core/files.hpp).
void write_soap_record(SoapRefreshRecord rec, const std::string& path);
// Reads a record to follow over a run of `steps` steps; UsageError naming `key`
// (precond.refresh_record) for a file that is not one, or a run longer than the record.
SoapRefreshRecord read_soap_record(const std::string& path, const std::string& key, int64_t steps);

}  // namespace pf
