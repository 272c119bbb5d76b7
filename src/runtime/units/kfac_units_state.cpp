// K-FAC's units in checkpoints (kfac_units.hpp): every chunk's ChunkKfac (tensors under a prefix
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
  for (const HostedChunk& c : chunks_) {
    chunks.push_back(c.kfac->chunk().save_state(kfac_prefix(rank, c.pipeline, c.stage), tensors));
    if (c.kfac->distributed()) dist.push_back(c.kfac->distributed()->save_state());
  }
  return {{"chunks", chunks}, {"distributed", dist}};
}

void KfacUnits::load_state(const CheckpointReader& r, int rank, const nlohmann::json& chunks,
                           const nlohmann::json* distributed) {
  if (chunks.size() != chunks_.size())
    usage_error("--resume", "rank {} of the checkpoint held {} model chunks, this layout gives it {}", rank,
                chunks.size(), chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    HostedChunk& c = chunks_[i];
    c.kfac->chunk().load_state(r, kfac_prefix(rank, c.pipeline, c.stage), chunks[i], c.kfac->holders());
  }
  // The fusion plan in use (a checkpoint without it: the DistributedKfac profiles again).
  size_t dists = 0;
  for (const HostedChunk& c : chunks_) dists += c.kfac->distributed() ? 1 : 0;
  if (!distributed || distributed->size() != dists) return;
  size_t d = 0;
  for (HostedChunk& c : chunks_)
    if (DistributedKfac* dk = c.kfac->distributed()) dk->load_state((*distributed)[d++]);
}

}  // namespace pf
