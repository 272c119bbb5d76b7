#include "sim/profile.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace pf {

namespace {

std::string slurp(const std::string& path, const std::string& flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(flag, "cannot open profile '{}'", path);
  std::stringstream b;
  b << f.rdbuf();
  return b.str();
}

double number(const std::string& cell, const std::string& where) {
  try {
    size_t used = 0;
    double v = std::stod(cell, &used);
    if (cell.find_first_not_of(" \t", used) == std::string::npos && v >= 0) return v;
  } catch (const std::exception&) {
  }
  usage_error(where, "expected a non-negative number, got '{}'", cell);
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

Profile read_profile_json(const std::string& path, const std::string& flag) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(slurp(path, flag));
  } catch (const json::parse_error& e) {
    usage_error(flag, "profile '{}' is not valid JSON: {}", path, e.what());
  }
  const std::string where = fmt::format("{} ({})", flag, path);
  auto num = [&](const json& o, const char* key, double dflt, bool required, const std::string& ctx) {
    if (!o.contains(key)) {
      if (required) usage_error(where, "missing '{}{}'", ctx, key);
      return dflt;
    }
    if (!o[key].is_number() || o[key].get<double>() < 0)
      usage_error(where, "'{}{}' must be a non-negative number", ctx, key);
    return o[key].get<double>();
  };
  if (!j.is_object() || j.value("format", "") != "pipefisher-profile")
    usage_error(where, "missing \"format\": \"pipefisher-profile\"");
  if (!j.contains("version") || j["version"] != 1) usage_error(where, "unsupported or missing 'version' (expected 1)");
  Profile p;
  p.micro_batch_size = static_cast<int>(num(j, "micro_batch_size", 0, true, ""));
  if (p.micro_batch_size < 1) usage_error(where, "'micro_batch_size' must be >= 1");
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty())
    usage_error(where, "'stages' must be a non-empty array");
  p.cost.stages.clear();
  for (size_t i = 0; i < j["stages"].size(); ++i) {
    const json& s = j["stages"][i];
    std::string ctx = fmt::format("stages[{}].", i);
    if (!s.is_object()) usage_error(where, "'stages[{}]' must be an object", i);
    StageCost c;
    c.forward = num(s, "forward", 0, true, ctx);
    c.backward = num(s, "backward", 0, true, ctx);
    c.input_grad = num(s, "input_grad", -1, false, ctx);
    c.weight_grad = num(s, "weight_grad", -1, false, ctx);
    c.curvature = num(s, "curvature", 0, false, ctx);
    c.inversion = num(s, "inversion", 0, false, ctx);
    c.precondition = num(s, "precondition", 0, false, ctx);
    c.optimizer = num(s, "optimizer", 0, false, ctx);
    c.layers = static_cast<int>(num(s, "layers", 1, false, ctx));
    c.activation_bytes = num(s, "activation_bytes", 0, false, ctx);
    c.grad_bytes = num(s, "grad_bytes", 0, false, ctx);
    c.curvature_bytes = num(s, "curvature_bytes", 0, false, ctx);
    p.cost.stages.push_back(c);
    p.memory.push_back({num(s, "mem_param", 0, false, ctx), num(s, "mem_act", 0, false, ctx),
                        num(s, "mem_peak_err", 0, false, ctx), num(s, "mem_save_err", 0, false, ctx),
                        num(s, "mem_kron", 0, false, ctx)});
  }
  if (j.contains("p2p")) {
    p.cost.p2p_latency = num(j["p2p"], "latency", 0, false, "p2p.");
    p.cost.p2p_bandwidth = num(j["p2p"], "bandwidth", 0, false, "p2p.");
  }
  if (j.contains("allreduce")) {
    p.cost.allreduce_alpha = num(j["allreduce"], "alpha", 0, false, "allreduce.");
    p.cost.allreduce_beta = num(j["allreduce"], "beta", 0, false, "allreduce.");
  }
  return p;
}

}  // namespace pf
