// This rank's K-FAC state in checkpoints (runtime/README.md): every hosted chunk's ChunkKfac and
// DistributedKfac, the plan's input and position, the profile in progress.
#include "runtime/executor.hpp"

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor_parts.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

namespace pf {

namespace {
nlohmann::json times_json(const ChunkKfacTimes& t) {
  return {t.curv_a, t.curv_b, t.inv_a, t.inv_b, t.prec, t.sync, t.curv_samples, t.inv_samples, t.prec_samples};
}
ChunkKfacTimes times_of(const nlohmann::json& j) {
  ChunkKfacTimes t;
  j[0].get_to(t.curv_a), j[1].get_to(t.curv_b), j[2].get_to(t.inv_a), j[3].get_to(t.inv_b);
  t.prec = j[4].get<double>(), t.sync = j[5].get<double>();
  t.curv_samples = j[6].get<int>(), t.inv_samples = j[7].get<int>(), t.prec_samples = j[8].get<int>();
  return t;
}
// The plan's input as saved: its profile JSON (runtime/plan_record.hpp), or the wire form's sums
// that checkpoints of earlier builds hold; empty without a plan.
PlanProfile saved_plan_input(const nlohmann::json& j, const Config& cfg, const Layout& layout, const std::string& where) {
  if (j.is_object()) return read_profile(j, where).plan;
  if (!j.is_array() || j.empty()) return {};
  PlanProfile p = ProfileLayout(layout).mean(j.get<std::vector<double>>());
  p.shape = plan_shape(cfg, layout);
  return p;
}
std::string kfac_file(int rank) { return fmt::format("kfac-rank-{}.safetensors", rank); }
std::string kfac_prefix(int rank, int pipeline, int stage) { return fmt::format("kfac.rank{}.p{}.s{}.", rank, pipeline, stage); }
}  // namespace

std::vector<CheckpointFile> Executor::write_kfac_state(const std::string& step_dir) const {
  if (!kfac_) return {};
  const KfacState& k = *kfac_;
  const int R = groups_.rank;
  NamedTensors tensors;
  Tensor marker(Shape{1});  // the file's key tensor (its metadata holds the scalars)
  marker[0] = static_cast<float>(R);
  tensors.emplace_back(fmt::format("kfac.rank{}", R), marker);
  nlohmann::json j;
  j["placement"] = cfg_.kfac.placement;
  nlohmann::json chunks = nlohmann::json::array();
  for (size_t i = 0; i < chunks_.size(); ++i)
    chunks.push_back(k.chunk[i]->save_state(kfac_prefix(R, chunks_[i]->pipeline, chunks_[i]->stage), tensors));
  j["chunks"] = chunks;
  nlohmann::json dist = nlohmann::json::array();
  for (const auto& d : k.dist) dist.push_back(d->save_state());
  j["distributed"] = dist;
  j["has_plan"] = static_cast<bool>(k.plan);
  j["plan_input"] = k.plan ? plan_profile_json(cfg_, layout_, k.plan_input) : nlohmann::json();
  j["plan_scale"] = k.plan_scale;
  j["dur_sum"] = k.dur_sum;
  j["dur_samples"] = k.dur_samples;
  nlohmann::json times = nlohmann::json::array();
  for (const ChunkKfacTimes& t : k.times) times.push_back(times_json(t));
  j["times"] = times;
  j["drift_steps"] = k.drift_steps;
  j["profiled_compute"] = k.profiled_compute;
  j["profile_start"] = k.profile_start;
  j["plan_start"] = k.plan_start;
  j["boundary"] = k.boundary;
  j["replan_at"] = k.replan_at;
  std::vector<SafetensorsTensor> st;
  for (const auto& [name, t] : tensors) st.push_back({name, t.shape(), t.span(), false});
  return {write_checkpoint_tensors(step_dir, kfac_file(R), st, {{"kfac_runtime", j.dump()}})};
}

void Executor::load_kfac_state(const CheckpointReader& r) {
  if (!kfac_) return;
  KfacState& k = *kfac_;
  const int R = groups_.rank;
  const std::string key = fmt::format("kfac.rank{}", R);
  if (!r.has(key)) usage_error("--resume", "{} holds no K-FAC state of rank {} (written without K-FAC, or by one process)", r.dir(), R);
  const auto& meta = r.metadata_of(key);
  auto it = meta.find("kfac_runtime");
  if (it == meta.end()) usage_error(r.dir() + "/" + kfac_file(R), "no \"kfac_runtime\" metadata");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
    if (j.at("placement").get<std::string>() != name_of(cfg_.kfac.placement))
      usage_error("kfac.placement", "the checkpoint's K-FAC state was written with kfac.placement = {}, this configuration has {}",
                  j.at("placement").get<std::string>(), cfg_.kfac.placement);
    if (j.at("chunks").size() != chunks_.size())
      usage_error("--resume", "rank {} of the checkpoint held {} model chunks, this layout gives it {}", R,
                  j.at("chunks").size(), chunks_.size());
    k.plan_input = saved_plan_input(j.at("plan_input"), cfg_, layout_, r.dir() + "/" + kfac_file(R) + " plan_input");
    k.plan_scale = j.at("plan_scale").get<double>();
    k.dur_sum = j.at("dur_sum").get<std::vector<double>>();
    PF_CHECK(k.dur_sum.size() == actions_.size(), "K-FAC profile of {} actions, this device has {}", k.dur_sum.size(),
             actions_.size());
    k.dur_samples = j.at("dur_samples").get<int>();
    k.times.clear();
    for (const auto& t : j.at("times")) k.times.push_back(times_of(t));
    k.drift_steps = j.at("drift_steps").get<int>();
    k.profiled_compute = j.at("profiled_compute").get<double>();
    k.profile_start = j.at("profile_start").get<int64_t>();
    k.plan_start = j.at("plan_start").get<int64_t>();
    k.boundary = j.at("boundary").get<int64_t>();
    k.replan_at = j.at("replan_at").get<int64_t>();
    // The plan in use, remade from the profile it was made from (timings of this run would give another).
    k.plan.reset();
    if (j.at("has_plan").get<bool>()) kfac_make_plan(true);
    if (k.plan && k.replan_at >= 0) kfac_drain_lists();
    for (size_t i = 0; i < chunks_.size(); ++i)
      k.chunk[i]->load_state(r, kfac_prefix(R, chunks_[i]->pipeline, chunks_[i]->stage), j.at("chunks")[i],
                             k.holders[i].get());
    // The fusion plan in use (a checkpoint without it: the DistributedKfac profiles again).
    if (j.contains("distributed") && j.at("distributed").size() == k.dist.size())
      for (size_t i = 0; i < k.dist.size(); ++i) k.dist[i]->load_state(j.at("distributed")[i]);
  } catch (const nlohmann::json::exception& e) {
    usage_error(r.dir() + "/" + kfac_file(R), "malformed K-FAC state: {}", e.what());
  }
}

std::vector<Executor::ChunkState> Executor::chunk_states() {
  std::vector<ChunkState> out;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    Chunk& c = *chunks_[i];
    out.push_back({c.pipeline, c.stage, {c.params, c.optim.get(), kfac_ ? &kfac_->chunk[i]->pre() : nullptr}});
  }
  return out;
}

}  // namespace pf
