// Token files: little-endian uint16 round trip and refusal of malformed files.
#include "core/error.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "vocab_fixture.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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

// Issue 20 item 12: run files are mapped, not read whole; what is not a token file is refused
// naming the key and the file (a directory was read as garbage, an empty file blamed its length).
TEST(TokenFile, MapRefusesWhatIsNotATokenFileNamingKeyAndFile) {
  const std::string dir = temp_path("dir.bin"), empty = temp_path("empty.bin"), fifo = temp_path("fifo.bin"),
                    odd = temp_path("odd2.bin"), big = temp_path("big2.bin");
  std::filesystem::create_directory(dir);
  std::ofstream(empty, std::ios::binary).flush();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(odd, std::ios::binary) << "abc";
  write_token_file(big, std::vector<int32_t>{1, 40000, 2}, 65536);
  const auto refusal = [](const std::string& path) {
    return message_of([&] { map_token_file(path, 30522, "data.train_file"); });
  };
  const std::string named = "data.train_file: '";
  EXPECT_THAT(refusal(dir), HasSubstr(named + dir + "': is a directory, not a token file"));
  EXPECT_THAT(refusal(empty), HasSubstr(named + empty + "': token file is empty"));
  EXPECT_THAT(refusal(fifo), HasSubstr(named + fifo + "': is not a regular file"));
  EXPECT_THAT(refusal(odd), HasSubstr(named + odd + "': token file has an odd number of bytes (3)"));
  EXPECT_THAT(refusal(big), HasSubstr(named + big + "': token id 40000 at position 1 is >= the vocabulary size 30522"));
  EXPECT_THAT(refusal(temp_path("absent.bin")), HasSubstr(named + temp_path("absent.bin") + "': cannot read"));
  const Tokens ok = map_token_file(big, 65536, "data.train_file");
  ASSERT_EQ(ok.size(), 3);
  EXPECT_EQ(ok[1], 40000);
  for (const std::string& p : {dir, empty, fifo, odd, big}) std::filesystem::remove(p);
}

// A sparse file's holes read as id 0 (valid in every vocabulary) and are not scanned, so a file
// far larger than memory maps at once; its data extents still are checked, wherever they lie.
TEST(TokenFile, SparseFilesMapWithoutReadingTheirHoles) {
  const std::string p = temp_path("sparse.bin");
  const uint64_t bytes = uint64_t{8} << 30;
  std::ofstream(p, std::ios::binary).flush();
  std::filesystem::resize_file(p, bytes);
  const Tokens t = map_token_file(p, 30522, "data.train_file");
  EXPECT_EQ(t.size(), static_cast<int64_t>(bytes / 2));
  EXPECT_EQ(t[t.size() - 1], 0);
  {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(uint64_t{6} << 30));
    f.write("\xff\xff", 2);
  }
  EXPECT_THAT(message_of([&] { map_token_file(p, 30522, "data.train_file"); }),
              HasSubstr("token id 65535 at position 3221225472 is >= the vocabulary size 30522"));
  std::filesystem::remove(p);
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
