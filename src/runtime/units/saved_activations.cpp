#include "runtime/units/saved_activations.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <cstring>

namespace pf {

SavedActivations::SavedActivations(const KfacPreconditioner& pre, int replica, int micro_batches,
                                   std::vector<int> slot_of, int64_t rows, bool allocate)
    : replica_(replica), micro_batches_(micro_batches), slot_of_(std::move(slot_of)), rows_(rows) {
  for (int s : slot_of_) slots_ += s >= 0;
  if (!allocate) return;
  for (size_t l = 0; l < pre.size(); ++l) {
    a_.push_back({Tensor(Shape{slots_ * rows_, pre.layer(l).d_in()}), std::vector<int64_t>(slots_, 0)});
    b_.push_back({Tensor(Shape{slots_ * rows_, pre.layer(l).d_out()}), std::vector<int64_t>(slots_, 0)});
  }
}

int SavedActivations::slot(int local_micro_batch) const {
  const int k = slot_of_.at(local_micro_batch);
  PF_CHECK(k >= 0, "CURV for micro-batch {} not held by this chunk", local_micro_batch);
  return k;
}

void SavedActivations::save(int layer, Side s, int micro_batch, const float* x, int64_t rows, int64_t cols) {
  Buffer& b = (s == Side::A ? a_ : b_)[layer];
  const int m = micro_batch - replica_ * micro_batches_;
  const int k = slot_of_.at(m);
  PF_CHECK(k >= 0 && rows <= rows_, "kfac save: micro-batch {} ({} rows) not held here", micro_batch, rows);
  std::memcpy(b.data.data() + k * rows_ * cols, x, static_cast<size_t>(rows * cols) * sizeof(float));
  b.rows[k] = rows;
}

const float* SavedActivations::data(int layer, Side s, int k) const {
  const Buffer& b = side(s).at(layer);
  return b.data.data() + k * rows_ * b.data.shape()[1];
}

void SavedActivations::zero() {
  for (auto* v : {&a_, &b_})
    for (Buffer& b : *v) b.data.zero();
}

nlohmann::json SavedActivations::save_state(const std::string& prefix, NamedTensors& out) const {
  nlohmann::json rows = nlohmann::json::array();
  for (size_t l = 0; l < a_.size(); ++l) {
    out.emplace_back(prefix + fmt::format("saved_a.{}", l), a_[l].data);
    out.emplace_back(prefix + fmt::format("saved_b.{}", l), b_[l].data);
    rows.push_back({a_[l].rows, b_[l].rows});
  }
  return rows;
}

void SavedActivations::load_state(const ReadTensor& read, const std::string& prefix, const nlohmann::json& rows) {
  for (size_t l = 0; l < a_.size(); ++l) {
    read(prefix + fmt::format("saved_a.{}", l), a_[l].data.shape(), a_[l].data.span());
    read(prefix + fmt::format("saved_b.{}", l), b_[l].data.shape(), b_[l].data.span());
    a_[l].rows = rows[l][0].get<std::vector<int64_t>>();
    b_[l].rows = rows[l][1].get<std::vector<int64_t>>();
    PF_CHECK(static_cast<int>(a_[l].rows.size()) == slots_ && static_cast<int>(b_[l].rows.size()) == slots_,
             "saved rows of layer {}: {} slots, expected {}", l, a_[l].rows.size(), slots_);
  }
}

}  // namespace pf
