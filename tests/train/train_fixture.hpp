#pragma once
// Shared set-up of the trainer tests: bert-tiny-sized runs on the committed sample token file
// (data/sample/moby-dick-1-20.bert.bin, train and validation), so no fetched corpus is needed.
#include "config/config.hpp"

#include <string>

namespace pf::test {

inline std::string sample_tokens() { return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin"; }

// bert-tiny (2 layers, hidden 128) on sequences of `seq` tokens, `mbs` micro-batches of `rows`.
inline Config sample_config(int seq = 32, int mbs = 2, int rows = 8) {
  // One thread: the pinned bits are for it (same seed + thread count => same bits).
  return Config::from_toml_string(
      "", {"model.preset=\"bert-tiny\"", "model.seq_len=" + std::to_string(seq), "data.vocab=\"bert\"",
           "data.train_file=\"" + sample_tokens() + "\"", "data.valid_file=\"" + sample_tokens() + "\"",
           "parallel.micro_batches=" + std::to_string(mbs), "parallel.micro_batch_size=" + std::to_string(rows),
           "train.threads=1", "train.seed=7", "optim.name=\"nvlamb\"", "optim.lr=5e-3", "optim.warmup_steps=5",
           "train.steps=20"});
}

}  // namespace pf::test
