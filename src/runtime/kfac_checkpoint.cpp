// This rank's K-FAC state in checkpoints (kfac_checkpoint.hpp).
#include "runtime/kfac_checkpoint.hpp"

#include "core/error.hpp"
#include "io/safetensors.hpp"

#include <nlohmann/json.hpp>

namespace pf {

namespace {
std::string kfac_file(int rank) { return fmt::format("kfac-rank-{}.safetensors", rank); }
}  // namespace

std::vector<CheckpointFile> write_kfac_state(const std::string& step_dir, int rank, const Config& cfg,
                                             const KfacUnits& units, const KfacPlacement& placement) {
  NamedTensors tensors;
  Tensor marker(Shape{1});  // the file's key tensor (its metadata holds the scalars)
  marker[0] = static_cast<float>(rank);
  tensors.emplace_back(fmt::format("kfac.rank{}", rank), marker);
  nlohmann::json j = units.save_state(rank, tensors);
  j["placement"] = cfg.kfac.placement;
  placement.save_state(j);
  std::vector<SafetensorsTensor> st;
  for (const auto& [name, t] : tensors) st.push_back({name, t.shape(), t.span(), false});
  return {write_checkpoint_tensors(step_dir, kfac_file(rank), st, {{"kfac_runtime", j.dump()}})};
}

void load_kfac_state(const CheckpointReader& r, int rank, const Config& cfg, KfacUnits& units, KfacPlacement& placement) {
  const std::string key = fmt::format("kfac.rank{}", rank), file = r.dir() + "/" + kfac_file(rank);
  if (!r.has(key)) usage_error("--resume", "{} holds no K-FAC state of rank {} (written without K-FAC, or by one process)", r.dir(), rank);
  const auto& meta = r.metadata_of(key);
  auto it = meta.find("kfac_runtime");
  if (it == meta.end()) usage_error(file, "no \"kfac_runtime\" metadata");
  try {
    const nlohmann::json j = nlohmann::json::parse(it->second);
    if (j.at("placement").get<std::string>() != name_of(cfg.kfac.placement))
      usage_error("kfac.placement", "the checkpoint's K-FAC state was written with kfac.placement = {}, this configuration has {}",
                  j.at("placement").get<std::string>(), cfg.kfac.placement);
    placement.load_state(j, file, r.manifest().step);
    units.load_state(r, rank, j.at("chunks"), j.contains("distributed") ? &j.at("distributed") : nullptr);
  } catch (const nlohmann::json::exception& e) {
    usage_error(file, "malformed K-FAC state: {}", e.what());
  }
}

}  // namespace pf
