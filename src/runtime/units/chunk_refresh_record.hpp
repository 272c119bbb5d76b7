#pragma once
// The refresh record of one chunk (kfac/refresh_record.hpp's events and splits): the step whose
// micro-batches built each committed factor, the inverse each factor (or diagonal block) holds,
// and at every PREC the pieces whose inverse changed. ChunkKfac tells it what happens; rank 0
// writes every chunk's events as out_dir/kfac_refresh.json (kfac_units_reports.cpp).
#include "kfac/kfac_layer.hpp"
#include "kfac/refresh_record.hpp"

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace pf {

class ChunkRefreshRecord {
 public:
  explicit ChunkRefreshRecord(std::vector<std::string> layer_names);

  // The factor (layer, s) was committed from the micro-batches of `step`.
  void committed(int layer, Side s, int64_t step) { committed_[layer][side_index(s)] = step; }
  bool has_factor(int layer, Side s) const { return committed_[layer][side_index(s)] >= 0; }
  // (layer, s, block) now holds an inverse of the factors committed now (block -1: whole).
  void inverted(int layer, Side s, int block);
  // A whole inversion supersedes the factor's block inversions: they are not replayed after it.
  void drop_blocks(int layer, Side s);
  // PREC at step t: an event for every piece whose inverse changed since the last PREC.
  void used_at(int64_t t);
  // The factor switched to `blocks` diagonal blocks from step t on.
  void split(int layer, Side s, int blocks, int64_t t);

  const std::vector<RefreshEvent>& events() const { return events_; }
  const std::vector<SplitEvent>& splits() const { return splits_; }

  // Checkpoint: the chunk JSON's keys committed, inverse, used, events and splits.
  void save(nlohmann::json& j) const;
  void load(const nlohmann::json& j);

 private:
  using Piece = std::tuple<int, int, int>;  // (layer, side, block)
  std::vector<std::string> names_;                 // [layer]
  std::vector<std::array<int64_t, 2>> committed_;  // [layer][side] step of the committed factor, -1: none
  std::map<Piece, InverseId> inverse_, used_;      // what each piece holds; what the last PREC used
  std::vector<RefreshEvent> events_;
  std::vector<SplitEvent> splits_;
};

}  // namespace pf
