#pragma once
// Tests that need the real vocabularies read them from PF_SOURCE_DIR/data/vocab (made by
// scripts/fetch-data.sh, which the test script always runs first). If they are absent the tests
// FAIL, saying so: they never skip silently.
#include "data/bpe.hpp"
#include "data/wordpiece.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace pf::test {

inline std::string source_dir() { return PF_SOURCE_DIR; }
inline std::string vocab_dir() { return source_dir() + "/data/vocab"; }
inline bool vocab_present() {
  for (const char* f : {"bert-base-uncased.txt", "gpt2-encoder.json", "gpt2-vocab.bpe"})
    if (!std::filesystem::exists(vocab_dir() + "/" + f)) return false;
  return true;
}
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Loaded once per test program.
class VocabTest : public ::testing::Test {
 protected:
  static const WordPieceTokenizer& bert() {
    static WordPieceTokenizer t = WordPieceTokenizer::load(vocab_dir() + "/bert-base-uncased.txt");
    return t;
  }
  static const Gpt2Tokenizer& gpt2() {
    static Gpt2Tokenizer t = Gpt2Tokenizer::load(vocab_dir() + "/gpt2-encoder.json", vocab_dir() + "/gpt2-vocab.bpe");
    return t;
  }
  void SetUp() override {
    if (!vocab_present())
      FAIL() << "vocabulary files missing in " << vocab_dir() << ": run scripts/fetch-data.sh first";
  }
};

}  // namespace pf::test
