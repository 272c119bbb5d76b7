// SOAP following a bubbles run's refresh record in one process (soap_replay.hpp).
#include "train/soap_replay.hpp"

#include "core/error.hpp"
#include "optim/soap_record.hpp"

#include <fmt/format.h>

namespace pf {

SoapReplay::SoapReplay(const Config& cfg, std::span<Param* const> params, Soap& soap)
    : soap_(soap), path_(cfg.kfac.refresh_record) {
  const std::string key = "precond.refresh_record";
  const SoapRefreshRecord rec = read_soap_record(path_, key, cfg.train.steps);
  std::map<std::string, int> weight;  // name -> rotated weight
  const std::vector<int> rotated = Soap::rotated_weights(params);
  for (size_t w = 0; w < rotated.size(); ++w) weight[params[rotated[w]]->name] = static_cast<int>(w);
  for (const SoapRefresh& r : rec.refreshes) {
    auto it = weight.find(r.weight);
    if (it == weight.end()) usage_error(key, "'{}' refreshes '{}', which this model's SOAP does not rotate", path_, r.weight);
    at_[r.step].push_back({it->second, r.side});
  }
  refreshes_ = rec.refreshes.size();
  soap_.refresh_by_units(true);
}

void SoapReplay::before_update(int64_t step) {
  auto it = at_.find(step);
  if (it == at_.end()) return;
  for (auto [w, side] : it->second) soap_.refresh_factor(w, side);
}

std::string SoapReplay::describe() const {
  return fmt::format("soap: replaying the refresh record {} ({} factor refreshes over {} steps)", path_, refreshes_,
                     at_.empty() ? 0 : at_.rbegin()->first + 1);
}

}  // namespace pf
