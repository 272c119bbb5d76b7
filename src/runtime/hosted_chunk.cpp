#include "runtime/hosted_chunk.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <utility>

namespace pf {

HostedChunk* HostedChunks::find(int pipeline, int stage) const {
  for (const auto& c : chunks_)
    if (c->pipeline == pipeline && c->stage == stage) return c.get();
  return nullptr;
}

HostedChunk& HostedChunks::at(int pipeline, int stage) const {
  HostedChunk* c = find(pipeline, stage);
  PF_CHECK(c, "device {} does not host stage {} of pipeline {}", device_, stage, pipeline);
  return *c;
}

size_t HostedChunks::index_of(int pipeline, int stage) const {
  const HostedChunk* c = &at(pipeline, stage);
  return static_cast<size_t>(std::find_if(chunks_.begin(), chunks_.end(), [&](const auto& x) { return x.get() == c; }) -
                             chunks_.begin());
}

HostedChunk& HostedChunks::add(int pipeline, int stage) {
  auto n = std::make_unique<HostedChunk>();
  n->pipeline = pipeline;
  n->stage = stage;
  const auto at = std::upper_bound(chunks_.begin(), chunks_.end(), std::pair(pipeline, stage),
                                   [](const std::pair<int, int>& k, const auto& c) { return k < std::pair(c->pipeline, c->stage); });
  return **chunks_.insert(at, std::move(n));
}

}  // namespace pf
