// SOAP's refresh record (soap_record.hpp): written whole, read with every field checked.
#include "optim/soap_record.hpp"

#include "core/error.hpp"
#include "core/files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace pf {

namespace {

using nlohmann::json;

constexpr const char* kFormat = "pipefisher-soap-refresh";
constexpr int kVersion = 1;
// Two refreshes per weight per step of a short run at most: megabytes.
constexpr size_t kMaxRecordBytes = size_t{256} << 20;

const char* side_name(int side) { return side == 0 ? "L" : "R"; }

// An integer field >= 0, or UsageError naming the key.
int64_t count(const json& j, const char* name, const std::string& key, const std::string& path) {
  if (!j.is_object() || !j.contains(name) || !j.at(name).is_number_integer() || j.at(name).get<int64_t>() < 0)
    usage_error(key, "'{}': \"{}\" is not an integer >= 0 in {}", path, name, j.dump().substr(0, 80));
  return j.at(name).get<int64_t>();
}

SoapRefresh refresh_of(const json& e, const std::string& key, const std::string& path) {
  SoapRefresh r;
  r.step = count(e, "step", key, path);
  if (!e.contains("weight") || !e.at("weight").is_string()) usage_error(key, "'{}': a refresh without a \"weight\" name", path);
  r.weight = e.at("weight").get<std::string>();
  const std::string side = e.contains("side") && e.at("side").is_string() ? e.at("side").get<std::string>() : "";
  if (side != "L" && side != "R") usage_error(key, "'{}': {}'s \"side\" is not \"L\" or \"R\"", path, r.weight);
  r.side = side == "L" ? 0 : 1;
  return r;
}

}  // namespace

void write_soap_record(SoapRefreshRecord rec, const std::string& path) {
  std::sort(rec.refreshes.begin(), rec.refreshes.end());
  json events = json::array();
  for (const SoapRefresh& r : rec.refreshes) events.push_back({{"step", r.step}, {"weight", r.weight}, {"side", side_name(r.side)}});
  const json out{{"format", kFormat}, {"version", kVersion},     {"steps", rec.steps},
                 {"plan_start", rec.plan_start}, {"period", rec.period}, {"refreshes", events}};
  write_file_atomic(path, out.dump(1) + "\n");
}

SoapRefreshRecord read_soap_record(const std::string& path, const std::string& key, int64_t steps) {
  const json j = json::parse(read_input_file(path, key, kMaxRecordBytes), nullptr, false);
  if (!j.is_object() || j.value("format", "") != kFormat)
    usage_error(key, "'{}' is not a SOAP refresh record (format \"{}\": a SOAP bubbles run's soap_refresh.json)", path, kFormat);
  if (j.value("version", 0) != kVersion)
    usage_error(key, "'{}' is version {} of the record; this build reads version {}", path, j["version"].dump(), kVersion);
  SoapRefreshRecord rec;
  rec.steps = count(j, "steps", key, path);
  if (steps > rec.steps)
    usage_error(key, "'{}' records {} steps; train.steps = {} would run past it (record a longer run)", path, rec.steps,
                steps);
  rec.plan_start = count(j, "plan_start", key, path);
  rec.period = static_cast<int>(count(j, "period", key, path));
  if (!j.contains("refreshes") || !j.at("refreshes").is_array()) usage_error(key, "'{}': no \"refreshes\" list", path);
  for (const json& e : j.at("refreshes")) rec.refreshes.push_back(refresh_of(e, key, path));
  return rec;
}

}  // namespace pf
