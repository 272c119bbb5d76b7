// This rank's K-FAC state in checkpoints (kfac_checkpoint.hpp).
#include "runtime/kfac_checkpoint.hpp"

#include "core/error.hpp"
#include "io/safetensors.hpp"

#include <nlohmann/json.hpp>

namespace pf {

namespace {
std::string kfac_file(int rank) { return fmt::format("kfac-rank-{}.safetensors", rank); }
std::string soap_file(int rank) { return fmt::format("soap-rank-{}.safetensors", rank); }

// One file of a rank's runtime state: a marker tensor named `key` (its metadata, `meta`, holds
// the JSON) and `tensors` after it.
CheckpointFile write_state_file(const std::string& step_dir, const std::string& file, const std::string& key, int rank,
                                NamedTensors tensors, const std::string& meta, const nlohmann::json& j) {
  Tensor marker(Shape{1});
  marker[0] = static_cast<float>(rank);
  tensors.emplace(tensors.begin(), key, marker);
  std::vector<SafetensorsTensor> st;
  for (const auto& [name, t] : tensors) st.push_back({name, t.shape(), t.span(), false});
  return write_checkpoint_tensors(step_dir, file, st, {{meta, j.dump()}});
}

// The JSON a state file's marker carries; UsageError naming `file` when it is absent or malformed.
nlohmann::json read_state_json(const CheckpointReader& r, const std::string& key, const std::string& file,
                               const std::string& meta) {
  const auto& m = r.metadata_of(key);
  auto it = m.find(meta);
  if (it == m.end()) usage_error(file, "no \"{}\" metadata", meta);
  try {
    return nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    usage_error(file, "malformed state: {}", e.what());
  }
}

void check_placement(const nlohmann::json& j, const Config& cfg) {
  if (j.at("placement").get<std::string>() != name_of(cfg.kfac.placement))
    usage_error("precond.placement", "the checkpoint's state was written with precond.placement = {}, this configuration has {}",
                j.at("placement").get<std::string>(), cfg.kfac.placement);
}
}  // namespace

std::vector<CheckpointFile> write_kfac_state(const std::string& step_dir, int rank, const Config& cfg,
                                             const KfacUnits& units, const KfacPlacement& placement) {
  NamedTensors tensors;
  nlohmann::json j = units.save_state(rank, tensors);
  j["placement"] = cfg.kfac.placement;
  placement.save_state(j);
  return {write_state_file(step_dir, kfac_file(rank), fmt::format("kfac.rank{}", rank), rank, std::move(tensors),
                           "kfac_runtime", j)};
}

void load_kfac_state(const CheckpointReader& r, int rank, const Config& cfg, KfacUnits& units, KfacPlacement& placement) {
  const std::string key = fmt::format("kfac.rank{}", rank), file = r.dir() + "/" + kfac_file(rank);
  if (!r.has(key)) usage_error("--resume", "{} holds no K-FAC state of rank {} (written without K-FAC, or by one process)", r.dir(), rank);
  const nlohmann::json j = read_state_json(r, key, file, "kfac_runtime");
  try {
    check_placement(j, cfg);
    placement.load_state(j, file, r.manifest().step);
    units.load_state(r, rank, j.at("chunks"), j.contains("distributed") ? &j.at("distributed") : nullptr);
  } catch (const nlohmann::json::exception& e) {
    usage_error(file, "malformed K-FAC state: {}", e.what());
  }
}

std::vector<CheckpointFile> write_soap_state(const std::string& step_dir, int rank, const Config& cfg,
                                             const KfacPlacement& placement) {
  nlohmann::json j;
  j["placement"] = cfg.kfac.placement;
  placement.save_state(j);
  return {write_state_file(step_dir, soap_file(rank), fmt::format("soap.rank{}", rank), rank, {}, "soap_runtime", j)};
}

void load_soap_state(const CheckpointReader& r, int rank, const Config& cfg, KfacPlacement& placement) {
  const std::string key = fmt::format("soap.rank{}", rank), file = r.dir() + "/" + soap_file(rank);
  if (!r.has(key))
    usage_error("--resume", "{} holds no state of SOAP's refreshes for rank {} (written by another placement, layout or build)",
                r.dir(), rank);
  const nlohmann::json j = read_state_json(r, key, file, "soap_runtime");
  try {
    check_placement(j, cfg);
    placement.load_state(j, file, r.manifest().step);
  } catch (const nlohmann::json::exception& e) {
    usage_error(file, "malformed state of SOAP's refreshes: {}", e.what());
  }
}

}  // namespace pf
