// SOAP's recorded refreshes as units of the lowered list (soap_record_placement.hpp).
#include "runtime/soap/soap_record_placement.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "optim/soap_record.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace pf {

SoapRecordPlacement::SoapRecordPlacement(const Config& cfg, const Layout& layout, const comm::Groups& groups,
                                         HostedChunks& chunks)
    : lowered_(layout.schedule.per_device.at(groups.stage)) {
  const std::string key = "precond.refresh_record", path = cfg.kfac.refresh_record;
  const SoapRefreshRecord rec = read_soap_record(path, key, cfg.train.steps);
  plan_start_ = rec.plan_start, period_ = rec.period;
  std::map<std::string, Action> unit;  // this device's rotated weights: name -> its EIG_L unit
  for (HostedChunk& c : chunks) {
    auto* soap = dynamic_cast<Soap*>(c.optim.get());
    PF_CHECK(soap, "stage {}: SOAP's record over a {} optimizer", c.stage, c.optim->name());
    soap->refresh_by_units(true);
    const std::vector<int> rotated = Soap::rotated_weights(c.params);
    for (size_t w = 0; w < rotated.size(); ++w)
      unit[c.params[static_cast<size_t>(rotated[w])]->name] = Action{Kind::EIG_L, c.stage, c.pipeline, -1, static_cast<int>(w)};
  }
  const auto first_opt = std::find_if(lowered_.begin(), lowered_.end(), [](const Action& a) { return a.kind == Kind::OPT; });
  double found = 0;
  for (const SoapRefresh& r : rec.refreshes) {
    auto it = unit.find(r.weight);
    if (it == unit.end()) continue;
    found += groups.replica == 0 && it->second.pipeline == 0;  // one copy of each weight counts
    auto [list, fresh] = lists_.try_emplace(r.step);
    if (fresh) list->second.assign(lowered_.begin(), first_opt);
    Action a = it->second;
    a.kind = eigenbasis_kind(r.side);
    list->second.push_back(a);
  }
  for (auto& [step, list] : lists_) list.insert(list.end(), first_opt, lowered_.end());
  comm::allreduce_sum(std::span<double>(&found, 1), MPI_COMM_WORLD, "SOAP's recorded refreshes");
  if (found != static_cast<double>(rec.refreshes.size()))
    usage_error(key, "'{}' refreshes {} factors, and this model's SOAP rotates the weights of {} of them", path,
                rec.refreshes.size(), found);
}

const std::vector<Action>& SoapRecordPlacement::actions_for(int64_t step) const {
  auto it = lists_.find(step);
  return it == lists_.end() ? lowered_ : it->second;
}

}  // namespace pf
