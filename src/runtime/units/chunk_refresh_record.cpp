#include "runtime/units/chunk_refresh_record.hpp"

#include <nlohmann/json.hpp>

#include <utility>

namespace pf {

namespace {

using nlohmann::json;

json inverse_map(const std::map<std::tuple<int, int, int>, InverseId>& m) {
  json out = json::array();
  for (const auto& [k, id] : m) out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), id.curv_step, id.pi_step});
  return out;
}

std::map<std::tuple<int, int, int>, InverseId> inverse_map(const json& j) {
  std::map<std::tuple<int, int, int>, InverseId> out;
  for (const json& e : j) out[{e[0].get<int>(), e[1].get<int>(), e[2].get<int>()}] = {e[3].get<int64_t>(), e[4].get<int64_t>()};
  return out;
}

}  // namespace

ChunkRefreshRecord::ChunkRefreshRecord(std::vector<std::string> layer_names)
    : names_(std::move(layer_names)), committed_(names_.size(), {-1, -1}) {}

void ChunkRefreshRecord::inverted(int layer, Side s, int block) {
  const int i = side_index(s);
  inverse_[{layer, i, block}] = {committed_[layer][i], committed_[layer][side_index(other_side(s))]};
}

void ChunkRefreshRecord::drop_blocks(int layer, Side s) {
  for (auto* m : {&inverse_, &used_})
    std::erase_if(*m, [&](const auto& e) {
      return std::get<0>(e.first) == layer && std::get<1>(e.first) == side_index(s) && std::get<2>(e.first) >= 0;
    });
}

void ChunkRefreshRecord::used_at(int64_t t) {
  for (const auto& [key, id] : inverse_) {
    auto it = used_.find(key);
    if (it != used_.end() && it->second == id) continue;
    used_[key] = id;
    events_.push_back({names_[std::get<0>(key)], std::get<1>(key), std::get<2>(key), t, id});
  }
}

void ChunkRefreshRecord::split(int layer, Side s, int blocks, int64_t t) {
  splits_.push_back({names_[layer], side_index(s), blocks, t});
}

void ChunkRefreshRecord::save(json& j) const {
  j["committed"] = committed_;
  j["inverse"] = inverse_map(inverse_);
  j["used"] = inverse_map(used_);
  json ev = json::array(), sp = json::array();
  for (const RefreshEvent& e : events_) ev.push_back({e.layer, e.side, e.block, e.use_step, e.id.curv_step, e.id.pi_step});
  for (const SplitEvent& s : splits_) sp.push_back({s.layer, s.side, s.blocks, s.from_step});
  j["events"] = ev;
  j["splits"] = sp;
}

void ChunkRefreshRecord::load(const json& j) {
  committed_ = j.at("committed").get<std::vector<std::array<int64_t, 2>>>();
  inverse_ = inverse_map(j.at("inverse"));
  used_ = inverse_map(j.at("used"));
  events_.clear();
  for (const json& e : j.at("events"))
    events_.push_back({e[0].get<std::string>(), e[1].get<int>(), e[2].get<int>(), e[3].get<int64_t>(),
                       {e[4].get<int64_t>(), e[5].get<int64_t>()}});
  splits_.clear();
  for (const json& e : j.at("splits"))
    splits_.push_back({e[0].get<std::string>(), e[1].get<int>(), e[2].get<int>(), e[3].get<int64_t>()});
}

}  // namespace pf
