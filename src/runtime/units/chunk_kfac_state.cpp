// ChunkKfac's checkpoint state (runtime/units/chunk_kfac.hpp). The factors, inverses and counters go
// through KfacPreconditioner::state() (the single-process format, under this chunk's prefix);
// what only a pipeline run has in flight is added: the sums in progress (a bubbles cycle spreads
// its curvature over several steps), the saved micro-batch buffers its CURV units still read,
// this replica's pending inverses (replica_sync.hpp), the cycle's counters and the refresh record
// (chunk_refresh_record.hpp).
#include "runtime/units/chunk_kfac.hpp"

#include "core/error.hpp"
#include "dkfac/distributed_kfac.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>

namespace pf {

namespace {

using nlohmann::json;

// JSON has no NaN or Inf (a skipped step's loss scale is one): those go as strings.
json num(double x) { return std::isfinite(x) ? json(x) : json(fmt::format("{}", x)); }
double num(const json& j) { return j.is_string() ? std::strtod(j.get<std::string>().c_str(), nullptr) : j.get<double>(); }

const char* side_name(int s) { return s == 0 ? "A" : "B"; }

}  // namespace

json ChunkKfac::save_state(const std::string& prefix, NamedTensors& out) const { return save_core(prefix, out, true); }

void ChunkKfac::load_state(const CheckpointReader& r, const std::string& prefix, const json& j, MPI_Comm comm) {
  load_core([&](const std::string& name, const Shape& shape, std::span<float> out) { r.read(name, shape, out); },
            r.dir(), prefix, j, comm, true);
}

// The state a step's curvature may change (not the saved buffers: a skipped cycle never reads them).
void ChunkKfac::take_snapshot(bool cycle) {
  snapshot_.clear();
  snapshot_scalars_ = save_core("", snapshot_, false).dump();
  snapshot_cycle_ = cycle;
}

void ChunkKfac::discard_step() {
  if (snapshot_.empty()) return;  // nothing of this step entered the factors
  const NamedTensors& snap = snapshot_;
  load_core([&](const std::string& name, const Shape& shape, std::span<float> out) {
              for (const auto& [n, t] : snap)
                if (n == name) {
                  PF_CHECK(t.shape() == shape, "snapshot tensor {}: shape changed", name);
                  std::copy(t.span().begin(), t.span().end(), out.begin());
                  return;
                }
              PF_CHECK(false, "snapshot has no tensor {}", name);
            },
            "the step's K-FAC snapshot", "", json::parse(snapshot_scalars_), sync_.comm(), false);
  if (snapshot_cycle_) {
    poisoned_ = true;
    // Its buffers hold the skipped step's data: never read now, and not worth a checkpoint.
    saved_.zero();
  }
  if (dist_) dist_->discard_step();  // this step tapped (a snapshot), so it began the DistributedKfac's step
  snapshot_.clear();
}

json ChunkKfac::save_core(const std::string& prefix, NamedTensors& out, bool buffers) const {
  json j;
  for (auto& [name, t] : pre_->state()) out.emplace_back(prefix + name, std::move(t));
  json factors = json::array();
  for (int l = 0; l < layers(); ++l)
    for (int s = 0; s < 2; ++s) {
      const Side sd = side_at(s);
      KfacFactor& f = pre_->layer(l).factor(sd);
      // With ema 0 the sum in progress is the factor itself (saved above); else its own buffer.
      if (f.own_accumulator())
        out.emplace_back(prefix + pre_->layer(l).name() + ".kfac." + side_name(s) + "_acc", f.accumulator());
      factors.push_back({f.pending_micro_batches(), num(f.trace()), f.num_blocks(), pre_->pending_rows(l, sd)});
    }
  j["factors"] = factors;
  j["saved"] = buffers ? saved_.save_state(prefix, out) : json::array();
  sync_.save(prefix, out);
  j["replicated"] = sync_.on();
  j["poisoned"] = poisoned_;
  j["cycle_step"] = cycle_step_;
  j["loss_scale"] = num(loss_scale_);
  j["next_cycle"] = {next_cycle_.first, num(next_cycle_.second)};
  j["curv_count"] = curv_count_;
  record_.save(j);
  return j;
}

void ChunkKfac::load_core(const ReadTensor& read, const std::string& what, const std::string& prefix, const json& j,
                          MPI_Comm comm, bool buffers) {
  const int L = layers();
  const json& factors = j.at("factors");
  if (static_cast<int>(factors.size()) != 2 * L || (buffers && j.at("saved").size() != saved_.layers()))
    usage_error(what, "the K-FAC state under '{}' has {} factors, this stage has {}", prefix, factors.size(), 2 * L);
  // Block structure first: set_blocks reallocates, loading then overwrites.
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < 2; ++s) {
      KfacFactor& f = pre_->layer(l).factor(side_at(s));
      const int blocks = factors[2 * l + s][2].get<int>();
      if (f.num_blocks() != blocks) f.set_blocks(blocks);
    }
  // Replicated or not first: it decides whether the sums in progress have their own buffers.
  const MPI_Comm want = j.at("replicated").get<bool>() ? comm : MPI_COMM_NULL;
  if (buffers || want != sync_.comm()) set_replicated(want);  // a snapshot: usually unchanged
  NamedTensors st = pre_->state();  // names and shapes, filled from the checkpoint
  for (auto& [name, t] : st) read(prefix + name, t.shape(), t.span());
  pre_->load_state(st);
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < 2; ++s) {
      const Side sd = side_at(s);
      KfacFactor& f = pre_->layer(l).factor(sd);
      const json& e = factors[2 * l + s];
      if (f.own_accumulator()) {
        Tensor& acc = f.accumulator();
        read(prefix + pre_->layer(l).name() + ".kfac." + side_name(s) + "_acc", acc.shape(), acc.span());
      }
      f.restore_accumulation(e[0].get<int64_t>(), num(e[1]));
      pre_->set_pending_rows(l, sd, e[3].get<int64_t>());
    }
  if (buffers) saved_.load_state(read, prefix, j.at("saved"));
  sync_.load(read, prefix);
  poisoned_ = j.value("poisoned", false);
  cycle_step_ = j.at("cycle_step").get<int64_t>();
  loss_scale_ = static_cast<float>(num(j.at("loss_scale")));
  next_cycle_ = {j.at("next_cycle")[0].get<int64_t>(), static_cast<float>(num(j.at("next_cycle")[1]))};
  curv_count_ = j.at("curv_count").get<std::vector<std::array<int, 2>>>();
  record_.load(j);
}

}  // namespace pf
