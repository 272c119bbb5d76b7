// K-FAC's units in checkpoints (kfac_units.hpp): every record's ChunkKfac (tensors under a prefix
// naming the rank and the chunk) and DistributedKfac, in the rank's kfac-rank-R file
// (runtime/kfac_checkpoint.cpp writes it with the placement's state).
#include "runtime/units/kfac_units.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

namespace pf {

namespace {
std::string kfac_prefix(int rank, int pipeline, int stage) { return fmt::format("kfac.rank{}.p{}.s{}.", rank, pipeline, stage); }
}  // namespace

nlohmann::json KfacUnits::save_state(int rank, NamedTensors& tensors) const {
  nlohmann::json chunks = nlohmann::json::array(), dist = nlohmann::json::array();
  for (const HostedKfac& h : hosted_) {
    chunks.push_back(h.kfac->save_state(kfac_prefix(rank, h.pipeline, h.stage), tensors));
    if (h.dist) dist.push_back(h.dist->save_state());
  }
  return {{"chunks", chunks}, {"distributed", dist}};
}

void KfacUnits::load_state(const CheckpointReader& r, int rank, const nlohmann::json& chunks,
                           const nlohmann::json* distributed) {
  if (chunks.size() != hosted_.size())
    usage_error("--resume", "rank {} of the checkpoint held {} model chunks, this layout gives it {}", rank,
                chunks.size(), hosted_.size());
  for (size_t i = 0; i < hosted_.size(); ++i) {
    HostedKfac& h = hosted_[i];
    h.kfac->load_state(r, kfac_prefix(rank, h.pipeline, h.stage), chunks[i], h.holders.get());
  }
  // The fusion plan in use (a checkpoint without it: the DistributedKfac profiles again).
  size_t dists = 0;
  for (const HostedKfac& h : hosted_) dists += h.dist ? 1 : 0;
  if (!distributed || distributed->size() != dists) return;
  size_t d = 0;
  for (HostedKfac& h : hosted_)
    if (h.dist) h.dist->load_state((*distributed)[d++]);
}

}  // namespace pf
