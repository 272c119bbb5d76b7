#include "runtime/plan_record.hpp"

#include "core/error.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

namespace pf {

nlohmann::json plan_shape(const Config& cfg, const Layout& layout) {
  nlohmann::json stages = nlohmann::json::array();
  for (const BlockRange& r : layout.stage_blocks) stages.push_back({r.first, r.last});
  const ModelConfig& m = cfg.model;
  return {{"schedule", layout.schedule.name},
          {"devices", layout.devices},
          {"replicas", layout.replicas},
          {"micro_batches", layout.micro_batches},
          {"stage_blocks", stages},
          {"arch", m.arch},
          {"layers", m.layers},
          {"hidden", m.hidden},
          {"ffn", m.ffn},
          {"vocab", m.vocab},
          {"seq_len", m.seq_len},
          {"micro_batch_size", cfg.parallel.micro_batch_size},
          {"kfac_diag_limit", cfg.kfac.diag_limit},
          {"nsp", cfg.data.nsp}};
}

nlohmann::json plan_record(const Config& cfg, const Layout& layout, const std::vector<double>& input) {
  return {{"shape", plan_shape(cfg, layout)}, {"input", input}};
}

std::vector<double> read_plan_profile(const Config& cfg, const Layout& layout, size_t size) {
  const std::string& path = cfg.kfac.plan_profile;
  const std::string key = "kfac.plan_profile";
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(key, "cannot open '{}'", path);
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) usage_error(key, "'{}' is not JSON", path);
  if (!j.is_object() || !j.contains("pipefisher_plan") || !j["pipefisher_plan"].is_object())
    usage_error(key, "'{}' holds no \"pipefisher_plan\" object (written by a kfac.placement = bubbles run)", path);
  const nlohmann::json& rec = j["pipefisher_plan"];
  const nlohmann::json want = plan_shape(cfg, layout);
  if (!rec.contains("shape") || rec["shape"] != want)
    usage_error(key, "'{}' was recorded for {}, this run is {}", path, rec.value("shape", nlohmann::json()).dump(),
                want.dump());
  if (!rec.contains("input") || !rec["input"].is_array() || rec["input"].size() != size)
    usage_error(key, "'{}': \"input\" must be an array of {} numbers", path, size);
  std::vector<double> v;
  for (const nlohmann::json& x : rec["input"]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
      usage_error(key, "'{}': \"input\" holds {}, expected finite non-negative numbers", path, x.dump());
    v.push_back(x.get<double>());
  }
  return v;
}

}  // namespace pf
