#pragma once
// precond.placement = replay with optim.name = soap: one process follows a SOAP bubbles run's
// refresh record (optim/soap_record.hpp). No basis moves by optim.soap.precondition_frequency;
// before step t's update each factor the record refreshed before that step is refreshed
// (Soap::refresh_factor), in the record's order. The pipeline's units did that arithmetic on
// the statistics and bases the previous update left, as this does, so the run trains what the
// pipeline trained to the layouts' rounding (tests/runtime/test_soap_bubbles.cpp).
#include "config/config.hpp"
#include "nn/param.hpp"
#include "optim/optimizer.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pf {

class SoapReplay {
 public:
  // Reads cfg.kfac.refresh_record; UsageError naming it for a file that is not a SOAP record, a
  // weight SOAP does not rotate here, or a run longer than the record.
  SoapReplay(const Config& cfg, std::span<Param* const> params, Soap& soap);
  // Before step t's update: the record's refreshes of step t.
  void before_update(int64_t step);
  // One line for the run's start: the record and how many refreshes it holds.
  std::string describe() const;

 private:
  Soap& soap_;
  std::string path_;
  size_t refreshes_ = 0;
  std::map<int64_t, std::vector<std::pair<int, int>>> at_;  // step -> (rotated weight, side)
};

}  // namespace pf
