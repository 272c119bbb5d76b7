// Malformed vocabulary files are refused with a UsageError that names the file.
#include "core/error.hpp"
#include "data/tokenizer.hpp"
#include "vocab_fixture.hpp"

#include <gmock/gmock.h>

#include <unistd.h>

using ::testing::HasSubstr;

namespace pf {
namespace {

class BadVocabTest : public test::VocabTest {
 protected:
  std::string dir_;
  void SetUp() override {
    test::VocabTest::SetUp();
    dir_ = ::testing::TempDir() + "/pf_bad_vocab_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  static std::string real(const std::string& name) { return test::slurp(test::vocab_dir() + "/" + name); }
  // Runs f, expects a UsageError whose message names `file` and contains `what`.
  template <typename F>
  void expect_refused(F&& f, const std::string& file, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "accepted a malformed " << file;
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr(file));
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  }
};

TEST_F(BadVocabTest, BertVocabularyProblems) {
  std::string missing = dir_ + "/nope.txt";
  expect_refused([&] { WordPieceTokenizer::load(missing); }, missing, "cannot open");
  std::string empty = write("empty.txt", "");
  expect_refused([&] { WordPieceTokenizer::load(empty); }, empty, "empty");
  std::string v = real("bert-base-uncased.txt");
  std::string truncated = write("trunc.txt", v.substr(0, 500));  // ends before [UNK]
  expect_refused([&] { WordPieceTokenizer::load(truncated); }, truncated, "truncated");
  std::string dup = write("dup.txt", v + "hello\n");
  expect_refused([&] { WordPieceTokenizer::load(dup); }, dup, "twice");
}

TEST_F(BadVocabTest, Gpt2EncoderProblems) {
  std::string bpe = write("vocab.bpe", real("gpt2-vocab.bpe"));
  std::string enc = real("gpt2-encoder.json");
  std::string truncated = write("trunc.json", enc.substr(0, enc.size() / 2));
  expect_refused([&] { Gpt2Tokenizer::load(truncated, bpe); }, truncated, "malformed JSON");
  std::string not_object = write("array.json", "[1, 2, 3]");
  expect_refused([&] { Gpt2Tokenizer::load(not_object, bpe); }, not_object, "JSON object");
  std::string bad_id = write("badid.json", R"({"a": "x"})");
  expect_refused([&] { Gpt2Tokenizer::load(bad_id, bpe); }, bad_id, "not an integer");
  std::string missing = dir_ + "/none.json";
  expect_refused([&] { Gpt2Tokenizer::load(missing, bpe); }, missing, "cannot open");
}

TEST_F(BadVocabTest, Gpt2MergesProblems) {
  std::string enc = write("encoder.json", real("gpt2-encoder.json"));
  std::string merges = real("gpt2-vocab.bpe");
  std::string truncated = write("trunc.bpe", merges.substr(0, merges.size() / 2));
  expect_refused([&] { Gpt2Tokenizer::load(enc, truncated); }, truncated, "no merge produces");
  std::string no_merges = write("header.bpe", "#version: 0.2\n");
  expect_refused([&] { Gpt2Tokenizer::load(enc, no_merges); }, no_merges, "no merge lines");
  std::string one_part = write("onepart.bpe", "#version: 0.2\n\u0120t\n" + merges.substr(merges.find('\n') + 1));
  expect_refused([&] { Gpt2Tokenizer::load(enc, one_part); }, one_part, "line 2");
  std::string unknown = write("unknown.bpe", "#version: 0.2\nqqqqqqqq zzzzzzzz\n");
  expect_refused([&] { Gpt2Tokenizer::load(enc, unknown); }, unknown, "missing from");
  std::string missing = dir_ + "/none.bpe";
  expect_refused([&] { Gpt2Tokenizer::load(enc, missing); }, missing, "cannot open");
}

TEST_F(BadVocabTest, UnknownVocabularyName) {
  EXPECT_THROW(load_tokenizer("roberta", test::vocab_dir()), UsageError);
  expect_refused([&] { load_tokenizer("bert", dir_); }, dir_ + "/bert-base-uncased.txt", "fetch-data");
}

}  // namespace
}  // namespace pf
