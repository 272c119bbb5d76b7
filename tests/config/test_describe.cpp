// docs/config.md is describe_config()'s output, and it describes every key with its default and
// bounds as the key table declares them.
#include "config/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>

namespace {

TEST(Describe, DocsConfigMdIsCurrent) {
  std::ifstream f(std::string(PF_SOURCE_DIR) + "/docs/config.md");
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(doc, pf::describe_config()) << "docs/config.md is stale: build/pipefisher config --describe > docs/config.md";
}

TEST(Describe, EveryKeyOnceWithItsTypeDefaultBoundsAndMeaning) {
  const std::string d = pf::describe_config();
  for (const std::string& key : pf::config_keys()) {
    const std::string cell = "| `" + key + "` |";
    const size_t at = d.find(cell);
    ASSERT_NE(at, std::string::npos) << key;
    EXPECT_EQ(d.find(cell, at + 1), std::string::npos) << key << " twice";
    const std::string row = d.substr(at, d.find('\n', at) - at);
    EXPECT_GE(std::count(row.begin(), row.end(), '|'), 6) << row;
    EXPECT_NE(row.substr(row.size() - 4), "|  |") << key << " has no meaning";
  }
  EXPECT_NE(d.find("| `model.hidden` | integer | `256` | > 0 | hidden size h |"), std::string::npos);
  EXPECT_NE(d.find("| `data.mask_prob` | number | `0.15` | (0, 1) |"), std::string::npos);
  EXPECT_NE(d.find("| `optim.name` | one of nvlamb, adamw, sgd, soap | `'nvlamb'` |"), std::string::npos);
  EXPECT_NE(d.find("| `optim.soap.shampoo_beta` | number | `0.95` | [0, 1) |"), std::string::npos);
  EXPECT_NE(d.find("| `kfac.warmup_steps` | integer | `-1` | >= -1 |"), std::string::npos);
  EXPECT_NE(d.find("| `train.out_dir` | path | `'runs/default'` | not empty |"), std::string::npos);
}

}  // namespace
