#include "sim/profile.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "sim/limits.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace pf {

namespace {

// A profile is megabytes at most: /dev/zero or a FIFO is refused before it is read.
std::string slurp(const std::string& path, const std::string& flag) {
  return read_input_file(path, flag, size_t{256} << 20);
}

// A finite number in [0, 2^53] (times in ms, memory in MB: sim/limits.hpp bounds what follows).
double number(const std::string& cell, const std::string& where) {
  try {
    size_t used = 0;
    double v = std::stod(cell, &used);
    if (cell.find_first_not_of(" \t", used) == std::string::npos && std::isfinite(v) && v >= 0 && v <= kMaxBytes)
      return v;
  } catch (const std::exception&) {
  }
  usage_error(where, "expected a finite non-negative number up to 2^53, got '{}'", cell);
}

// nlohmann's overflow message quotes the number ("number overflow parsing '1e999'"); the key
// before its first occurrence in the text names the field.
std::string overflow_field(const std::string& text, const std::string& message) {
  const size_t q0 = message.find('\''), q1 = q0 == std::string::npos ? q0 : message.find('\'', q0 + 1);
  if (q1 == std::string::npos) return message;
  const std::string number = message.substr(q0 + 1, q1 - q0 - 1);
  const size_t at = text.find(number);
  std::string key;
  if (at != std::string::npos) {
    size_t i = at;
    while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n' || text[i - 1] == '\r')) --i;
    if (i > 0 && text[i - 1] == ':') {
      --i;
      while (i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n' || text[i - 1] == '\r')) --i;
      if (i > 1 && text[i - 1] == '"') {
        const size_t open = text.rfind('"', i - 2);
        if (open != std::string::npos) key = text.substr(open + 1, i - 2 - open);
      }
    }
  }
  const std::string shown = number.size() > 40 ? number.substr(0, 40) + "..." : number;
  if (key.empty() || key.size() > 64) return fmt::format("the number {} is beyond the range of a double", shown);
  return fmt::format("'{}': the number {} is beyond the range of a double", key, shown);
}

}  // namespace

std::vector<ProfileRow> read_paper_csv(const std::string& path, const std::string& flag) {
  static const char* kHeader =
      "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron";
  std::istringstream in(slurp(path, flag));
  std::string line;
  std::vector<ProfileRow> rows;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::string where = fmt::format("{} ({}:{})", flag, path, ln);
    if (ln == 1) {
      if (line != kHeader) usage_error(where, "expected the header '{}'", kHeader);
      continue;
    }
    std::vector<std::string> c;
    std::istringstream row(line);
    for (std::string x; std::getline(row, x, ',');) c.push_back(x);
    if (c.size() != 11) usage_error(where, "expected 11 columns, got {}", c.size());
    ProfileRow r;
    double bs = number(c[0], where);
    if (bs < 1 || bs != static_cast<int>(bs)) usage_error(where, "bs must be a positive integer, got '{}'", c[0]);
    r.bs = static_cast<int>(bs);
    double* v[] = {&r.time_f, &r.time_b, &r.time_kron, &r.time_inv, &r.time_prec, &r.mem_param,
                   &r.mem_act, &r.mem_peak_err, &r.mem_save_err, &r.mem_kron};
    for (int k = 0; k < 10; ++k) *v[k] = number(c[k + 1], where);
    rows.push_back(r);
  }
  if (ln == 0) usage_error(flag, "profile '{}' is empty", path);
  if (rows.empty()) usage_error(flag, "profile '{}' has no data rows", path);
  return rows;
}

Profile profile_from_row(const ProfileRow& row, int L) {
  Profile p;
  p.micro_batch_size = row.bs;
  StageCost c;
  c.forward = L * row.time_f;
  c.backward = L * row.time_b;
  c.curvature = L * row.time_kron;
  c.inversion = L * row.time_inv;
  c.precondition = L * row.time_prec;
  c.layers = L;
  p.cost.stages = {c};
  p.memory = {StageMemory{L * row.mem_param, L * row.mem_act, L * row.mem_peak_err, L * row.mem_save_err,
                          L * row.mem_kron}};
  return p;
}

Profile with_stage_blocks(const Profile& per_block, const std::vector<int>& blocks) {
  Profile p = per_block;
  const StageCost& c = per_block.cost.stage(0);
  const StageMemory m = per_block.memory.empty() ? StageMemory{} : per_block.memory.front();
  p.cost.stages.clear();
  p.memory.clear();
  for (int b : blocks) {
    StageCost s = c;
    for (double* x : {&s.forward, &s.backward, &s.curvature, &s.inversion, &s.precondition, &s.optimizer,
                      &s.grad_bytes, &s.curvature_bytes})
      *x *= b;
    if (s.input_grad >= 0) s.input_grad *= b;
    if (s.weight_grad >= 0) s.weight_grad *= b;
    s.layers = c.layers * b;
    p.cost.stages.push_back(s);
    p.memory.push_back({b * m.param, b * m.act, b * m.err_peak, b * m.err_save, b * m.kron, b * m.deferred});
  }
  return p;
}

namespace {

using nlohmann::json;

json parse_profile(const std::string& path, const std::string& flag) {
  const std::string text = slurp(path, flag);
  try {
    return json::parse(text);
  } catch (const json::out_of_range& e) {
    // A number beyond double (1e999): name the field it belongs to.
    usage_error(flag, "profile '{}': {}", path, overflow_field(text, e.what()));
  } catch (const json::exception& e) {
    usage_error(flag, "profile '{}' is not valid JSON: {}", path, e.what());
  }
}

// Keys whose values are times (ms); every other number is bytes, MB or a count.
bool is_time_key(const std::string& k) {
  return k == "forward" || k == "backward" || k == "input_grad" || k == "weight_grad" || k == "curvature" ||
         k == "inversion" || k == "precondition" || k == "optimizer" || k == "latency" || k == "alpha" ||
         k == "beta" || k == "curvature_a" || k == "curvature_b" || k == "inversion_a" || k == "inversion_b" ||
         k == "sync" || k == "step_time";
}

// Reads the fields of one profile file; every error names the file (`where`) and the field's path
// (`ctx` + key).
struct ProfileReader {
  std::string where;

  // Times (ms) up to kMaxDuration, everything else (bytes, MB, counts) up to kMaxBytes.
  double num(const json& o, const char* key, double dflt, bool required, const std::string& ctx) const {
    if (!o.contains(key)) {
      if (required) usage_error(where, "missing '{}{}'", ctx, key);
      return dflt;
    }
    const bool time = is_time_key(key);
    const double limit = time ? kMaxDuration : kMaxBytes;
    if (!o[key].is_number() || !std::isfinite(o[key].get<double>()) || o[key].get<double>() < 0 ||
        o[key].get<double>() > limit)
      usage_error(where, "'{}{}' must be a finite number in [0, {:.4g}]{}", ctx, key, limit,
                  time ? " (ms: 2^53 us)" : " (2^53)");
    return o[key].get<double>();
  }

  int count(const json& o, const char* key, double dflt, bool required, const std::string& ctx) const {
    const double v = num(o, key, dflt, required, ctx);
    if (v < 1 || v > std::numeric_limits<int>::max() || v != std::floor(v))
      usage_error(where, "'{}{}' must be an integer in [1, {}]", ctx, key, std::numeric_limits<int>::max());
    return static_cast<int>(v);
  }

  StageCost stage_cost(const json& s, const std::string& ctx) const {
    StageCost c;
    c.forward = num(s, "forward", 0, true, ctx);
    c.backward = num(s, "backward", 0, true, ctx);
    c.input_grad = num(s, "input_grad", -1, false, ctx);
    c.weight_grad = num(s, "weight_grad", -1, false, ctx);
    c.curvature = num(s, "curvature", 0, false, ctx);
    c.inversion = num(s, "inversion", 0, false, ctx);
    c.precondition = num(s, "precondition", 0, false, ctx);
    c.optimizer = num(s, "optimizer", 0, false, ctx);
    c.layers = count(s, "layers", 1, false, ctx);
    c.activation_bytes = num(s, "activation_bytes", 0, false, ctx);
    c.grad_bytes = num(s, "grad_bytes", 0, false, ctx);
    c.curvature_bytes = num(s, "curvature_bytes", 0, false, ctx);
    return c;
  }

  StageMemory stage_memory(const json& s, const std::string& ctx) const {
    return {.param = num(s, "mem_param", 0, false, ctx),
            .act = num(s, "mem_act", 0, false, ctx),
            .err_peak = num(s, "mem_peak_err", 0, false, ctx),
            .err_save = num(s, "mem_save_err", 0, false, ctx),
            .kron = num(s, "mem_kron", 0, false, ctx),
            .deferred = num(s, "mem_deferred", 0, false, ctx)};
  }

  // One K-FAC unit of "kfac_layers" appended to `k`; returns its name ("" for none).
  std::string kfac_layer(const json& u, const std::string& lc, StageKfacCost& k) const {
    if (!u.is_object()) usage_error(where, "'{}' must be an object", lc.substr(0, lc.size() - 1));
    k.curv_a.push_back(num(u, "curvature_a", 0, true, lc));
    k.curv_b.push_back(num(u, "curvature_b", 0, true, lc));
    k.inv_a.push_back(num(u, "inversion_a", 0, true, lc));
    k.inv_b.push_back(num(u, "inversion_b", 0, true, lc));
    k.dim_a.push_back(count(u, "d_in", 1, true, lc));
    k.dim_b.push_back(count(u, "d_out", 1, true, lc));
    if (u.contains("diagonal_b") && !u["diagonal_b"].is_boolean())
      usage_error(where, "'{}diagonal_b' must be true or false", lc);
    k.diag_b.push_back(u.contains("diagonal_b") && u["diagonal_b"].get<bool>() ? 1 : 0);
    return u.contains("name") && u["name"].is_string() ? u["name"].get<std::string>() : "";
  }

  // A stage's "kfac_layers", appended to p.plan.kfac and p.layer_names.
  void stage_kfac(const json& s, const std::string& ctx, const StageCost& c, Profile& p) const {
    if (!s["kfac_layers"].is_array() || s["kfac_layers"].empty())
      usage_error(where, "'{}kfac_layers' must be a non-empty array", ctx);
    StageKfacCost k;
    std::vector<std::string> names;
    for (size_t l = 0; l < s["kfac_layers"].size(); ++l)
      names.push_back(kfac_layer(s["kfac_layers"][l], fmt::format("{}kfac_layers[{}].", ctx, l), k));
    k.precondition = c.precondition;
    k.sync = num(s, "sync", 0, false, ctx);
    p.plan.kfac.push_back(std::move(k));
    p.layer_names.push_back(std::move(names));
  }

  // A stage's "soap_weights" (SOAP's units: per rotated weight its refreshes and statistics),
  // appended to p.plan.kfac and p.layer_names.
  void stage_soap(const json& s, const std::string& ctx, Profile& p) const {
    if (!s["soap_weights"].is_array() || s["soap_weights"].empty())
      usage_error(where, "'{}soap_weights' must be a non-empty array", ctx);
    StageKfacCost k;
    std::vector<std::string> names;
    for (size_t w = 0; w < s["soap_weights"].size(); ++w) {
      const json& u = s["soap_weights"][w];
      const std::string wc = fmt::format("{}soap_weights[{}].", ctx, w);
      if (!u.is_object()) usage_error(where, "'{}' must be an object", wc.substr(0, wc.size() - 1));
      k.eig_l.push_back(num(u, "eigenbasis_l", 0, true, wc));
      k.eig_r.push_back(num(u, "eigenbasis_r", 0, true, wc));
      k.statistics.push_back(num(u, "statistics", 0, true, wc));
      names.push_back(u.contains("name") && u["name"].is_string() ? u["name"].get<std::string>() : "");
    }
    p.plan.kfac.push_back(std::move(k));
    p.layer_names.push_back(std::move(names));
  }

  void stages(const json& j, Profile& p) const {
    if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
      usage_error(where, "'stages' must be a non-empty array");
    p.cost.stages.clear();
    for (size_t i = 0; i < j["stages"].size(); ++i) {
      const json& s = j["stages"][i];
      std::string ctx = fmt::format("stages[{}].", i);
      if (!s.is_object()) usage_error(where, "'stages[{}]' must be an object", i);
      const StageCost c = stage_cost(s, ctx);
      p.cost.stages.push_back(c);
      p.memory.push_back(stage_memory(s, ctx));
      if (s.contains("kfac_layers") && s.contains("soap_weights"))
        usage_error(where, "'{}' has both 'kfac_layers' and 'soap_weights': a run plans one optimizer's work", ctx);
      if (s.contains("kfac_layers")) stage_kfac(s, ctx, c, p);
      if (s.contains("soap_weights")) stage_soap(s, ctx, p);
    }
    if (!p.plan.kfac.empty() && p.plan.kfac.size() != p.cost.stages.size())
      usage_error(where, "'kfac_layers' or 'soap_weights' given for {} of {} stages: every stage or none",
                  p.plan.kfac.size(), p.cost.stages.size());
    const auto soap = [](const StageKfacCost& k) { return k.curv_a.empty(); };
    if (!std::all_of(p.plan.kfac.begin(), p.plan.kfac.end(), soap) && std::any_of(p.plan.kfac.begin(), p.plan.kfac.end(), soap))
      usage_error(where, "some stages give 'kfac_layers', others 'soap_weights': every stage the same optimizer's");
  }

  void links(const json& j, Profile& p) const {
    if (j.contains("p2p")) {
      p.cost.p2p_latency = num(j["p2p"], "latency", 0, false, "p2p.");
      p.cost.p2p_bandwidth = num(j["p2p"], "bandwidth", 0, false, "p2p.");
    }
    if (j.contains("allreduce")) {
      p.cost.allreduce_alpha = num(j["allreduce"], "alpha", 0, false, "allreduce.");
      p.cost.allreduce_beta = num(j["allreduce"], "beta", 0, false, "allreduce.");
    }
    if (j.contains("broadcast")) {
      p.plan.bcast_alpha = num(j["broadcast"], "alpha", 0, true, "broadcast.");
      p.plan.bcast_beta = num(j["broadcast"], "beta", 0, true, "broadcast.");
    }
  }

  // "pipefisher_plan": the shape and the per-device action times a run planned from.
  void plan_record(const json& j, PlanProfile& p) const {
    const json& r = j["pipefisher_plan"];
    if (!r.contains("shape") || !r["shape"].is_object())
      usage_error(where, "'pipefisher_plan.shape' must be an object");
    if (!r["action_ms"].is_array() || r["action_ms"].empty())
      usage_error(where, "'pipefisher_plan.action_ms' must be a non-empty array, one array per device");
    p.shape = r["shape"];
    for (size_t d = 0; d < r["action_ms"].size(); ++d) {
      const json& row = r["action_ms"][d];
      auto time = [](const json& x) {
        return x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() >= 0 && x.get<double>() <= kMaxDuration;
      };
      if (!row.is_array() || !std::all_of(row.begin(), row.end(), time))
        usage_error(where, "'pipefisher_plan.action_ms[{}]' must be an array of finite numbers in [0, {:.4g}] (ms: 2^53 us)",
                    d, kMaxDuration);
      p.action_ms.push_back(row.get<std::vector<double>>());
    }
  }

  // The run's shape from j[key] ("run", or "measured" in older files).
  ProfileRun run(const json& j, const char* key) const {
    const json& r = j[key];
    const std::string ctx = std::string(key) + ".";
    if (!r.is_object()) usage_error(where, "'{}' must be an object", key);
    ProfileRun run;
    if (!r.contains("schedule") || !r["schedule"].is_string()) usage_error(where, "missing '{}schedule'", ctx);
    run.schedule = r["schedule"].get<std::string>();
    run.devices = count(r, "devices", 0, true, ctx);
    run.micro_batches = count(r, "micro_batches", 0, true, ctx);
    run.replicas = count(r, "replicas", 1, false, ctx);
    run.virtual_stages = count(r, "virtual_stages", 1, false, ctx);
    if (r.contains("model") && r["model"].is_string()) run.model = r["model"].get<std::string>();
    if (r.contains("kfac") && r["kfac"].is_string()) run.kfac = r["kfac"].get<std::string>();
    if (r.contains("recompute") && !r["recompute"].is_boolean())
      usage_error(where, "'{}recompute' must be true or false", ctx);
    run.recompute = r.value("recompute", false);
    if (run.kfac != "off" && run.kfac != "inline" && run.kfac != "skip" && run.kfac != "bubbles" && run.kfac != "adaptive")
      usage_error(where, "'{}kfac' must be off, inline, skip, bubbles or adaptive, got '{}'", ctx, run.kfac);
    if (j.contains("measured") && j["measured"].is_object() && j["measured"].contains("step_time"))
      run.step_time = num(j["measured"], "step_time", 0, false, "measured.");
    return run;
  }
};

// Where the run's shape is: "run", else what older files kept in "measured"; nullptr when
// neither has it (an older file's "measured" without them gives no shape: flags as before).
const char* run_key(const json& j) {
  const char* key = j.contains("run") ? "run" : j.contains("measured") ? "measured" : nullptr;
  if (key && std::string(key) == "measured" &&
      !(j[key].is_object() && j[key].contains("schedule") && j[key].contains("devices") &&
        j[key].contains("micro_batches")))
    return nullptr;
  return key;
}

}  // namespace

Profile read_profile_json(const std::string& path, const std::string& flag) {
  return read_profile(parse_profile(path, flag), fmt::format("{} ({})", flag, path));
}

Profile read_profile(const json& j, const std::string& where) {
  const ProfileReader read{where};
  if (!j.is_object() || j.value("format", "") != "pipefisher-profile")
    usage_error(read.where, "missing \"format\": \"pipefisher-profile\"");
  if (!j.contains("version") || j["version"] != 1)
    usage_error(read.where, "unsupported or missing 'version' (expected 1)");
  Profile p;
  p.micro_batch_size = read.count(j, "micro_batch_size", 0, true, "");
  read.stages(j, p);
  read.links(j, p);
  // Records of earlier builds (the wire form as "input") carry no action times: the simulator
  // never read them.
  if (j.contains("pipefisher_plan") && j["pipefisher_plan"].contains("action_ms")) read.plan_record(j, p.plan);
  if (const char* key = run_key(j)) p.run = read.run(j, key);
  return p;
}

namespace {

// One stage's "kfac_layers", and their curvature and inversion summed.
json kfac_layers_json(const StageKfacCost& c, const std::vector<std::string>& names, double& curvature,
                      double& inversion) {
  json units = json::array();
  for (int l = 0; l < c.layers(); ++l) {
    json u = {{"d_in", c.dim_a[l]},         {"d_out", c.dim_b[l]},
              {"curvature_a", c.curv_a[l]}, {"curvature_b", c.curv_b[l]},
              {"inversion_a", c.inv_a[l]},  {"inversion_b", c.inv_b[l]},
              {"diagonal_b", !c.diag_b.empty() && c.diag_b[l] == 1}};
    if (l < static_cast<int>(names.size()) && !names[l].empty()) u["name"] = names[l];
    curvature += c.curv_a[l] + c.curv_b[l];
    inversion += c.inv_a[l] + c.inv_b[l];
    units.push_back(std::move(u));
  }
  return units;
}

// One stage's "soap_weights": per rotated weight its two refreshes and its statistics (ms).
json soap_weights_json(const StageKfacCost& c, const std::vector<std::string>& names) {
  json units = json::array();
  for (size_t w = 0; w < c.eig_l.size(); ++w) {
    json u = {{"eigenbasis_l", c.eig_l[w]}, {"eigenbasis_r", c.eig_r.at(w)}, {"statistics", c.statistics.at(w)}};
    if (w < names.size() && !names[w].empty()) u["name"] = names[w];
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace

void add_plan_profile(json& profile, const PlanProfile& p, const std::vector<std::vector<std::string>>& names) {
  for (size_t s = 0; s < p.kfac.size(); ++s) {
    const StageKfacCost& c = p.kfac[s];
    json& stage = profile.at("stages").at(s);
    if (c.curv_a.empty() && !c.eig_l.empty()) {  // SOAP's units (a SOAP stage has no K-FAC unit)
      stage["soap_weights"] = soap_weights_json(c, s < names.size() ? names[s] : std::vector<std::string>{});
      continue;
    }
    double curvature = 0, inversion = 0;
    stage["kfac_layers"] = kfac_layers_json(c, s < names.size() ? names[s] : std::vector<std::string>{}, curvature, inversion);
    stage["layers"] = std::max(1, c.layers());
    stage["curvature"] = curvature;
    stage["inversion"] = inversion;
    stage["precondition"] = c.precondition;
    stage["sync"] = c.sync;
  }
  if (p.bcast_alpha >= 0) profile["broadcast"] = {{"alpha", p.bcast_alpha}, {"beta", p.bcast_beta}};
  if (!p.action_ms.empty()) profile["pipefisher_plan"] = {{"shape", p.shape}, {"action_ms", p.action_ms}};
}

PlanProfile with_fixed_costs(PlanProfile p) {
  for (std::vector<double>& row : p.action_ms) std::fill(row.begin(), row.end(), 1.0);
  for (StageKfacCost& s : p.kfac) {
    s.precondition = 0.1, s.sync = 0.1;
    for (std::vector<double>* per_micro_batch : {&s.curv_a, &s.curv_b, &s.statistics})
      std::fill(per_micro_batch->begin(), per_micro_batch->end(), 0.05);
    for (std::vector<double>* refresh : {&s.inv_a, &s.inv_b, &s.eig_l, &s.eig_r})
      std::fill(refresh->begin(), refresh->end(), 0.3);
  }
  if (p.bcast_alpha >= 0) p.bcast_alpha = 0, p.bcast_beta = 0;
  return p;
}

}  // namespace pf
