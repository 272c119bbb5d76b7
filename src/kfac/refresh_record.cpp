#include "kfac/refresh_record.hpp"

#include "core/error.hpp"
#include "core/files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>

namespace pf {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "pipefisher-refresh";
constexpr int kVersion = 1;
// A record holds a few events per factor per step of a short run: megabytes at most.
constexpr size_t kMaxRecordBytes = size_t{256} << 20;

template <typename T>
std::string text(const T& v) {
  return fmt::format("{}", v);
}

auto event_key(const RefreshEvent& e) { return std::tie(e.use_step, e.layer, e.side, e.block); }
auto split_key(const SplitEvent& s) { return std::tie(s.from_step, s.layer, s.side); }

// A field of the record as T, or UsageError naming the key and the field.
template <typename T>
T field(const json& j, const char* name, const std::string& key, const std::string& path) {
  if (!j.is_object() || !j.contains(name)) usage_error(key, "'{}': no \"{}\" in {}", path, name, j.dump().substr(0, 80));
  const json& v = j.at(name);
  if constexpr (std::is_integral_v<T>) {
    // nlohmann converts a float or an out-of-range integer with a cast (undefined behaviour).
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                      : v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                            v.get<int64_t>() <= std::numeric_limits<T>::max();
    if (!fits) usage_error(key, "'{}': \"{}\" is not an integer in [{}, {}]", path, name, std::numeric_limits<T>::min(),
                           std::numeric_limits<T>::max());
  }
  try {
    return v.get<T>();
  } catch (const json::exception&) {
    usage_error(key, "'{}': \"{}\" is not {}", path, name, std::is_same_v<T, std::string> ? "text" : "a number");
  }
}

std::map<std::string, std::string> text_map(const json& j, const char* name, const std::string& key,
                                            const std::string& path) {
  std::map<std::string, std::string> out;
  const json m = field<json>(j, name, key, path);
  if (!m.is_object()) usage_error(key, "'{}': \"{}\" is not an object", path, name);
  for (const auto& [k, v] : m.items()) out[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return out;
}

RefreshEvent event_of(const json& e, const std::string& key, const std::string& path) {
  RefreshEvent r{field<std::string>(e, "layer", key, path), field<int>(e, "side", key, path),
                 field<int>(e, "block", key, path), field<int64_t>(e, "use_step", key, path),
                 {field<int64_t>(e, "curv_step", key, path), field<int64_t>(e, "pi_step", key, path)}};
  const bool ok = (r.side == 0 || r.side == 1) && r.block >= -1 && r.use_step >= 0 && r.id.curv_step >= 0 &&
                  r.id.curv_step <= r.use_step && r.id.pi_step >= -1 && r.id.pi_step <= r.use_step;
  if (!ok) usage_error(key, "'{}': an impossible event {}", path, e.dump());
  return r;
}

SplitEvent split_of(const json& s, const std::string& key, const std::string& path) {
  SplitEvent r{field<std::string>(s, "layer", key, path), field<int>(s, "side", key, path),
               field<int>(s, "blocks", key, path), field<int64_t>(s, "from_step", key, path)};
  if (!((r.side == 0 || r.side == 1) && r.blocks >= 1 && r.from_step >= 0))
    usage_error(key, "'{}': an impossible split {}", path, s.dump());
  return r;
}

}  // namespace

std::map<std::string, std::string> record_shape(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  return {{"model.arch", text(m.arch)},
          {"model.layers", text(m.layers)},
          {"model.hidden", text(m.hidden)},
          {"model.heads", text(m.heads)},
          {"model.ffn", text(m.ffn)},
          {"model.vocab", text(m.vocab)},
          {"model.seq_len", text(m.seq_len)},
          {"data.nsp", text(cfg.data.nsp)},
          {"parallel.data_parallel", text(p.data_parallel)},
          {"parallel.micro_batches", text(p.micro_batches)},
          {"parallel.micro_batch_size", text(p.micro_batch_size)},
          {"kfac.diag_limit", text(cfg.kfac.diag_limit)}};
}

std::map<std::string, std::string> record_layout(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return {{"parallel.stages", text(p.stages)},
          {"parallel.schedule", text(p.schedule)},
          {"parallel.virtual_stages", text(p.virtual_stages)},
          {"kfac.split_inversions", text(cfg.kfac.split_inversions)},
          {"kfac.plan_profile", cfg.kfac.plan_profile}};
}

void write_refresh_record(RefreshRecord rec, const std::string& path) {
  std::sort(rec.events.begin(), rec.events.end(), [](const auto& a, const auto& b) { return event_key(a) < event_key(b); });
  std::sort(rec.splits.begin(), rec.splits.end(), [](const auto& a, const auto& b) { return split_key(a) < split_key(b); });
  json out = {{"format", kFormat},          {"version", kVersion},          {"steps", rec.steps},
              {"plan_start", rec.plan_start}, {"period", rec.period},         {"recorded_with", rec.recorded_with},
              {"layout", rec.layout},         {"events", json::array()},      {"splits", json::array()}};
  for (const RefreshEvent& e : rec.events)
    out["events"].push_back({{"layer", e.layer}, {"side", e.side}, {"block", e.block}, {"use_step", e.use_step},
                             {"curv_step", e.id.curv_step}, {"pi_step", e.id.pi_step}});
  for (const SplitEvent& s : rec.splits)
    out["splits"].push_back({{"layer", s.layer}, {"side", s.side}, {"blocks", s.blocks}, {"from_step", s.from_step}});
  write_file_atomic(path, out.dump(1) + "\n");
}

RefreshRecord read_refresh_record(const std::string& path, const std::string& key) {
  const json j = json::parse(read_input_file(path, key, kMaxRecordBytes), nullptr, false);
  if (j.is_discarded() || !j.is_object()) usage_error(key, "'{}' is not a JSON object", path);
  if (j.value("format", "") != kFormat)
    usage_error(key, "'{}' is not a refresh record (\"format\": \"{}\"; a kfac.placement = bubbles run writes "
                "out_dir/kfac_refresh.json)", path, kFormat);
  if (field<int>(j, "version", key, path) != kVersion)
    usage_error(key, "'{}' is version {} of the record; this build reads version {}", path, j["version"].dump(), kVersion);
  RefreshRecord r;
  r.path = path;
  r.steps = field<int64_t>(j, "steps", key, path);
  r.plan_start = field<int64_t>(j, "plan_start", key, path);
  r.period = field<int>(j, "period", key, path);
  if (r.steps < 1 || r.plan_start < 0 || r.period < 0 || r.period > r.steps)
    usage_error(key, "'{}': steps {}, plan_start {}, period {} cannot be", path, r.steps, r.plan_start, r.period);
  r.recorded_with = text_map(j, "recorded_with", key, path);
  r.layout = text_map(j, "layout", key, path);
  for (const json& e : field<json>(j, "events", key, path)) r.events.push_back(event_of(e, key, path));
  for (const json& s : field<json>(j, "splits", key, path)) r.splits.push_back(split_of(s, key, path));
  std::sort(r.events.begin(), r.events.end(), [](const auto& a, const auto& b) { return event_key(a) < event_key(b); });
  std::sort(r.splits.begin(), r.splits.end(), [](const auto& a, const auto& b) { return split_key(a) < split_key(b); });
  return r;
}

void check_record_fits(const RefreshRecord& rec, const Config& cfg, const std::string& key) {
  for (const auto& [name, value] : record_shape(cfg)) {
    auto it = rec.recorded_with.find(name);
    const std::string recorded = it == rec.recorded_with.end() ? "(absent)" : it->second;
    if (recorded != value)
      usage_error(name, "{} here, but {} '{}' was recorded with {}: a replay needs the run's own shape", value, key,
                  rec.path, recorded);
  }
}

namespace {

RefreshEvent shifted(RefreshEvent e, int64_t by) {
  e.use_step += by;
  e.id.curv_step += by;
  if (e.id.pi_step >= 0) e.id.pi_step += by;
  return e;
}

// The record's last two periods agree (every event of [n - P, n) is one of [n - 2P, n - P) shifted
// by P) and no split falls in them, so the last one may be repeated; else UsageError naming `key`.
void require_steady(const RefreshRecord& rec, const std::vector<std::vector<RefreshEvent>>& by_step,
                    const std::string& key) {
  const int64_t n = rec.steps, P = rec.period;
  if (P == 0)
    usage_error(key, "'{}': the recording run never planned (no \"period\"): it cannot be followed past its {} steps",
                rec.path, n);
  if (n - 2 * P < rec.plan_start)
    usage_error(key, "'{}': the recording run's {} steps hold fewer than two periods of {} steps after its plan began "
                "at step {}: record at least {} steps", rec.path, n, P, rec.plan_start, rec.plan_start + 2 * P);
  for (int64_t u = n - P; u < n; ++u) {
    std::vector<RefreshEvent> want;
    for (const RefreshEvent& e : by_step[u - P]) want.push_back(shifted(e, P));
    if (want != by_step[u])
      usage_error(key, "'{}': its steps {} to {} do not repeat steps {} to {} (the plan changed, or had not "
                  "settled): it cannot be followed past its {} steps; record a longer run with "
                  "kfac.replan_on_drift = false", rec.path, n - P, n - 1, n - 2 * P, n - P - 1, n);
  }
  for (const SplitEvent& s : rec.splits)
    if (s.from_step > n - 2 * P)
      usage_error(key, "'{}': a factor was re-partitioned at step {}, within its last two periods", rec.path, s.from_step);
}

}  // namespace

RefreshPattern::RefreshPattern(const RefreshRecord& rec, int64_t steps, const std::string& key)
    : events_(static_cast<size_t>(steps)), splits_(static_cast<size_t>(steps)), builds_(static_cast<size_t>(steps)) {
  const int64_t n = rec.steps, P = rec.period;
  std::vector<std::vector<RefreshEvent>> recorded(static_cast<size_t>(n));
  for (const RefreshEvent& e : rec.events)
    if (e.use_step < n) recorded[e.use_step].push_back(e);
  if (steps > n) require_steady(rec, recorded, key);
  for (int64_t u = 0; u < steps; ++u) {
    const int64_t back = u < n ? 0 : (u - (n - P)) / P * P;  // u - back lies in the last period
    for (const RefreshEvent& e : recorded[u - back]) events_[u].push_back(shifted(e, back));
  }
  for (const SplitEvent& s : rec.splits)
    if (s.from_step < steps) splits_[s.from_step].push_back(s);
  for (const std::vector<RefreshEvent>& at : events_)
    for (const RefreshEvent& e : at)
      for (int64_t from : {e.id.curv_step, e.id.pi_step}) {
        if (from < 0) continue;
        builds_[from].push_back(e.layer);
        max_lag_ = std::max(max_lag_, e.use_step - from);
      }
  for (std::vector<std::string>& b : builds_) {
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
  }
}

const std::vector<RefreshEvent>& RefreshPattern::events_at(int64_t step) const { return events_.at(step); }
const std::vector<SplitEvent>& RefreshPattern::splits_at(int64_t step) const { return splits_.at(step); }

bool RefreshPattern::builds(const std::string& layer, int64_t step) const {
  const std::vector<std::string>& b = builds_.at(step);
  return std::binary_search(b.begin(), b.end(), layer);
}

}  // namespace pf
