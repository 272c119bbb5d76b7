// PipeFisher's records in the executor (runtime/pipefisher.hpp): the DistributedKfac's start line
// and dkfac.json, the refresh record, and this rank's K-FAC state in checkpoints.
#include "runtime/executor.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "runtime/executor_parts.hpp"
#include "runtime/pipefisher.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace pf {

std::string Executor::kfac_distributed_line() const {
  if (!kfac_ || kfac_->dist.empty()) return "";
  const DistributedKfac& d = *kfac_->dist.front();
  const KfacConfig& kc = cfg_.kfac;
  const std::string ablation = kc.distributed != KfacStrategy::SpdKfac || (kc.spd_pipelining && kc.spd_balance) ? ""
                               : kc.spd_pipelining ? ", no balance" : kc.spd_balance ? ", no pipelining"
                                                                                     : ", no pipelining, no balance";
  return fmt::format("K-FAC factors and inversions shared by {}{} among {} copies of each stage; stage {}: {} factors, "
                     "{} inverses broadcast, perf model {}", kc.distributed, ablation, kfac_->holders.front().size(),
                     chunks_.front()->stage, d.factors(), d.placement().communicated(),
                     kfac_->perf->from_cache ? "cached" : "measured");
}

namespace {
// What dkfac.json says of the whole run, from every rank's record (write_dkfac_record): replica
// 0's pipeline-0 stages in stage order with their factors and placements concatenated, and the
// time totals averaged over the ranks.
struct DkfacSummary {
  nlohmann::json stages = nlohmann::json::array(), owner = nlohmann::json::array(), load = nlohmann::json::array();
  int factors = 0, communicated = 0, fused_a = 0, fused_b = 0;
  nlohmann::json times = nlohmann::json::object();  // each rank's "times", key by key
};

DkfacSummary summarize_dkfac(const std::vector<std::string>& ranks, int stages) {
  using nlohmann::json;
  DkfacSummary sum;
  std::vector<json> per_stage(static_cast<size_t>(stages));
  for (const std::string& r : ranks) {
    const json j = json::parse(r);
    for (const auto& [key, v] : j["times"].items())
      sum.times[key] = sum.times.value(key, 0.0) + v.get<double>() / static_cast<double>(ranks.size());
    if (j["replica"] != 0) continue;
    for (const json& st : j["stages"])
      if (st["pipeline"] == 0) per_stage.at(st["stage"].get<size_t>()) = st;
  }
  for (const json& st : per_stage) {
    for (const json& o : st["placement"]["owner"]) sum.owner.push_back(o);
    sum.load.push_back(st["placement"]["model_load_s"]);
    sum.factors += st["factors"].get<int>(), sum.communicated += st["placement"]["communicated"].get<int>();
    sum.fused_a += st["fused_messages"]["A"].get<int>(), sum.fused_b += st["fused_messages"]["B"].get<int>();
    sum.stages.push_back(st);
  }
  return sum;
}
}  // namespace

void Executor::write_dkfac_record(const std::string& path, double step_time_sum, int timed_steps) {
  if (!kfac_ || kfac_->dist.empty()) return;
  KfacState& k = *kfac_;
  using nlohmann::json;
  // This rank: its stages' fusion and placement, and its time totals (per curvature / inversion step).
  json stages = json::array();
  double inflight = 0, wait = 0, messages = 0, inversion = 0, inverse_wait = 0;
  int steps = 0, inversion_steps = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const DistributedKfac& d = *k.dist[i];
    const InversionPlacement& pl = d.placement();
    stages.push_back({{"pipeline", chunks_[i]->pipeline}, {"stage", chunks_[i]->stage}, {"factors", d.factors()},
                      {"fused_messages", {{"A", d.groups(Side::A).size()}, {"B", d.groups(Side::B).size()}}},
                      {"placement", {{"owner", pl.owner}, {"communicated", pl.communicated()}, {"model_load_s", pl.load}}}});
    const DkfacTimes& t = d.times();
    inflight += t.factor_inflight, wait += t.factor_wait, messages += t.factor_messages;
    inversion += t.inversion, inverse_wait += t.inverse_wait;
    steps = std::max(steps, t.steps), inversion_steps = std::max(inversion_steps, t.inversion_steps);
  }
  const double ks = std::max(1, steps), is = std::max(1, inversion_steps);
  const json mine = {{"replica", groups_.replica}, {"stages", stages},
                     {"times", {{"factor_inflight_s", inflight / ks}, {"factor_wait_s", wait / ks},
                                {"factor_messages", messages / ks}, {"inversion_s", inversion / is},
                                {"inverse_wait_s", inverse_wait / is},
                                {"step_time_s", timed_steps > 0 ? step_time_sum / timed_steps : 0.0}}}};
  const std::vector<std::string> all = comm::gather_bytes(mine.dump(), 0, MPI_COMM_WORLD);
  if (groups_.rank != 0) return;
  const DkfacSummary sum = summarize_dkfac(all, layout_.stages());
  const KfacConfig& kc = cfg_.kfac;
  json out = {
      {"strategy", kc.distributed},
      {"pipelining", kc.distributed == KfacStrategy::SpdKfac && kc.spd_pipelining},
      {"balance", kc.distributed == KfacStrategy::SpdKfac && kc.spd_balance},
      {"ranks", all.size()},
      {"holders_per_stage", k.holders.front().size()},
      {"factors", sum.factors},
      {"fused_messages", {{"A", sum.fused_a}, {"B", sum.fused_b}}},
      // The whole model's factors, stage after stage (owner: the rank among the stage's holders).
      {"placement", {{"owner", sum.owner}, {"communicated", sum.communicated},
                     {"model_load_s", sum.load.size() == 1 ? sum.load[0] : sum.load}}},
      {"stages", sum.stages},
      {"perf_model", json::parse(comm::perf_model_to_json(*k.perf))},
      {"timed_steps", timed_steps},
  };
  out.update(sum.times);  // step_time_s, factor_inflight_s, factor_wait_s, factor_messages, inversion_s, inverse_wait_s
  const double inflight_s = sum.times.value("factor_inflight_s", 0.0), wait_s = sum.times.value("factor_wait_s", 0.0);
  out["factor_hidden_fraction"] = inflight_s > 0 ? 1.0 - wait_s / inflight_s : 0.0;
  write_file_atomic(path, out.dump(2) + "\n");
}

void Executor::write_kfac_record(const std::string& path) {
  if (!kfac_) return;
  std::vector<const ChunkKfac*> mine;
  for (auto& c : kfac_->chunk) mine.push_back(c.get());
  write_refresh_record(mine, path, groups_.rank);
}

// --- K-FAC checkpoints ---

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
  j["plan_input"] = k.plan_input;
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
    k.plan_input = j.at("plan_input").get<std::vector<double>>();
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

void Executor::kfac_discard_step() {
  for (auto& ck : kfac_->chunk) ck->discard_step();
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
