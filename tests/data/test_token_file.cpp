// Token files: little-endian uint16 round trip and refusal of malformed files.
#include "core/error.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "vocab_fixture.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

using ::testing::HasSubstr;

namespace pf {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/pf_tokfile_" + std::to_string(::getpid()) + "_" + name;
}
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(TokenFile, RoundTripIsLittleEndianUint16) {
  const std::string p = temp_path("rt.bin");
  std::vector<int32_t> ids{0, 1, 258, 65535, 30000};
  write_token_file(p, ids, 65536);
  const std::string raw = test::slurp(p);
  ASSERT_EQ(raw.size(), 10u);
  EXPECT_EQ(static_cast<uint8_t>(raw[4]), 0x02);  // 258 = 0x0102, low byte first
  EXPECT_EQ(static_cast<uint8_t>(raw[5]), 0x01);
  auto back = read_token_file(p, 65536);
  EXPECT_EQ(std::vector<int32_t>(back.begin(), back.end()), ids);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp." + std::to_string(::getpid())));
  std::filesystem::remove(p);
}

TEST(TokenFile, RefusesMalformedFiles) {
  const std::string odd = temp_path("odd.bin");
  std::ofstream(odd, std::ios::binary) << "abc";
  EXPECT_THAT(message_of([&] { read_token_file(odd, 100); }), HasSubstr(odd + ": token file has an odd number"));
  const std::string big = temp_path("big.bin");
  write_token_file(big, std::vector<int32_t>{1, 2, 500}, 1000);
  EXPECT_THAT(message_of([&] { read_token_file(big, 300); }), HasSubstr(big + ": token id 500 at position 2"));
  const std::string missing = temp_path("missing.bin");
  EXPECT_THAT(message_of([&] { read_token_file(missing, 300); }), HasSubstr(missing));
  std::filesystem::remove(odd);
  std::filesystem::remove(big);
}

TEST(TokenFile, RefusesVocabulariesThatDoNotFitUint16) {
  const std::string p = temp_path("huge.bin");
  EXPECT_THAT(message_of([&] { write_token_file(p, std::vector<int32_t>{1}, 65537); }), HasSubstr("65537"));
  EXPECT_THAT(message_of([&] { write_token_file(p, std::vector<int32_t>{70}, 50); }), HasSubstr("token id 70"));
  EXPECT_FALSE(std::filesystem::exists(p));
}

using SampleTokenFiles = test::VocabTest;

// The committed token files of the sample must stay what the tokenizers produce.
TEST_F(SampleTokenFiles, MatchAFreshTokenization) {
  const std::string base = test::source_dir() + "/data/sample/moby-dick-1-20";
  const std::string text = test::slurp(base + ".txt");
  for (const Tokenizer* tok : {static_cast<const Tokenizer*>(&bert()), static_cast<const Tokenizer*>(&gpt2())}) {
    auto file = read_token_file(base + "." + tok->name() + ".bin", tok->vocab_size());
    auto fresh = tokenize_corpus(*tok, text);
    EXPECT_EQ(std::vector<int32_t>(file.begin(), file.end()), fresh) << tok->name();
  }
}

}  // namespace
}  // namespace pf
