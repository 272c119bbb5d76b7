// `pipefisher tokenize`: printed ids, token files, and exit status 2 with a one-line message on
// bad arguments.
#include "data/token_file.hpp"
#include "vocab_fixture.hpp"
#include "../support/launch.hpp"

#include <gmock/gmock.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

using ::testing::HasSubstr;

namespace pf {
namespace {

struct CliResult {
  int status;
  std::string output;  // stdout and stderr
};
CliResult run(const std::string& args) {
  const pf_test::Launch r = pf_test::run(std::string(PF_BINARY) + " tokenize " + args);
  return {r.status, r.out};
}

using TokenizeCli = test::VocabTest;

TEST_F(TokenizeCli, PrintsIds) {
  const std::string dir = " --vocab-dir " + test::vocab_dir();
  CliResult bert = run("--vocab bert" + dir + " 'Hello world!'");
  EXPECT_EQ(bert.status, 0);
  EXPECT_EQ(bert.output, "101 7592 2088 999 102\n");
  CliResult gpt = run("--vocab gpt2" + dir + " 'Hello, my dog is cute'");
  EXPECT_EQ(gpt.output, "15496 11 616 3290 318 13779\n");
  CliResult dec = run("--vocab gpt2" + dir + " --decode '15496 11 616 3290 318 13779'");
  EXPECT_EQ(dec.output, "Hello, my dog is cute\n");
}

TEST_F(TokenizeCli, WritesTokenFile) {
  const std::string in = test::source_dir() + "/data/sample/moby-dick-1-20.txt";
  const std::string out = ::testing::TempDir() + "/pf_cli_" + std::to_string(::getpid()) + ".bin";
  CliResult r = run("--vocab gpt2 --vocab-dir " + test::vocab_dir() + " --in " + in + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  auto ids = read_token_file(out, gpt2().vocab_size());
  auto expect = gpt2().encode(test::slurp(in));
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), expect);
  std::filesystem::remove(out);
}

// --docs: where each document (text between blank lines) starts, independently: the documents
// encoded one by one, their lengths summed. The committed sample's index is this file.
TEST_F(TokenizeCli, WritesTheDocumentIndex) {
  const std::string in = test::source_dir() + "/data/sample/moby-dick-1-20.txt";
  const std::string base = ::testing::TempDir() + "/pf_cli_docs_" + std::to_string(::getpid());
  CliResult r = run("--vocab bert --vocab-dir " + test::vocab_dir() + " --in " + in + " --out " + base + ".bin --docs " +
                    base + ".docs");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string text = test::slurp(in);
  auto ids = read_token_file(base + ".bin", bert().vocab_size());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), bert().encode(text));
  std::vector<int64_t> want;
  int64_t at = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t blank = text.find("\n\n", pos);
    const size_t end = blank == std::string::npos ? text.size() : blank + 2;
    const int64_t n = static_cast<int64_t>(bert().encode(text.substr(pos, end - pos)).size());
    if (n > 0) want.push_back(at);
    at += n;
    pos = end;
  }
  EXPECT_EQ(read_doc_index(base + ".docs", at, "test"), want);
  EXPECT_EQ(read_doc_index(test::source_dir() + "/data/sample/moby-dick-1-20.bert.docs", at, "test"), want);
  EXPECT_GT(want.size(), 100u);
  std::filesystem::remove(base + ".bin");
  std::filesystem::remove(base + ".docs");
}

TEST_F(TokenizeCli, BadArgumentsExitWithStatus2) {
  const std::string dir = " --vocab-dir " + test::vocab_dir();
  CliResult no_out = run("--vocab bert" + dir + " --in x.txt");
  EXPECT_EQ(no_out.status, 2);
  EXPECT_THAT(no_out.output, HasSubstr("--out"));
  CliResult not_bin = run("--vocab bert" + dir + " --in x.txt --out x.txt");
  EXPECT_EQ(not_bin.status, 2);
  EXPECT_THAT(not_bin.output, HasSubstr(".bin"));
  CliResult missing_in = run("--vocab bert" + dir + " --in /nonexistent/x.txt --out /tmp/pf_never.bin");
  EXPECT_EQ(missing_in.status, 2);
  EXPECT_THAT(missing_in.output, HasSubstr("/nonexistent/x.txt"));
  EXPECT_FALSE(std::filesystem::exists("/tmp/pf_never.bin"));
  CliResult no_vocab = run("--vocab gpt2 --vocab-dir /nonexistent/vocab hello");
  EXPECT_EQ(no_vocab.status, 2);
  EXPECT_THAT(no_vocab.output, HasSubstr("/nonexistent/vocab/gpt2-encoder.json"));
  EXPECT_THAT(no_vocab.output, HasSubstr("fetch-data.sh"));
  CliResult bad_vocab = run("--vocab roberta hello");
  EXPECT_EQ(bad_vocab.status, 2);
  EXPECT_EQ(std::count(no_vocab.output.begin(), no_vocab.output.end(), '\n'), 1);  // one line
}

// A directory as --in is refused naming it, and no token file appears (an ifstream reads a
// directory as an empty text: an empty .bin and status 0 before).
TEST_F(TokenizeCli, DirectoryInputIsRefusedAndNothingIsWritten) {
  const std::string dir = ::testing::TempDir() + "/pf_cli_dir_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string out = dir + ".bin";
  CliResult r = run("--vocab bert --vocab-dir " + test::vocab_dir() + " --in " + dir + " --out " + out);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_EQ(r.output, "pipefisher: " + dir + ": is a directory, not the input text\n");
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove_all(dir);
}

// Invalid UTF-8 is refused by both vocabularies alike, naming the file and the byte's offset in the
// whole text (BERT dropped such bytes silently before), and nothing is written.
TEST_F(TokenizeCli, InvalidUtf8IsRefusedByBothVocabularies) {
  const std::string base = ::testing::TempDir() + "/pf_cli_utf8_" + std::to_string(::getpid());
  std::string text = "First document, clean.\n\nSecond one.\n\nThird: caf\xc3\xa9 then a stray byte ";
  const size_t bad = text.size();
  text += "\xff here.\n";
  std::ofstream(base + ".txt", std::ios::binary) << text;
  for (const std::string vocab : {"bert", "gpt2"}) {
    CliResult r = run("--vocab " + vocab + " --vocab-dir " + test::vocab_dir() + " --in " + base + ".txt --out " +
                      base + ".bin");
    EXPECT_EQ(r.status, 2) << vocab << ": " << r.output;
    EXPECT_EQ(r.output, "pipefisher: " + base + ".txt: invalid UTF-8 near byte " + std::to_string(bad) + "\n") << vocab;
    EXPECT_FALSE(std::filesystem::exists(base + ".bin")) << vocab;
    CliResult arg = run("--vocab " + vocab + " --vocab-dir " + test::vocab_dir() + " \"$(printf 'ab\\303(')\"");  // a lead byte, then '('
    EXPECT_EQ(arg.status, 2) << vocab << ": " << arg.output;
    EXPECT_EQ(arg.output, "pipefisher: text: invalid UTF-8 near byte 2\n") << vocab;
  }
  std::filesystem::remove(base + ".txt");
}

}  // namespace
}  // namespace pf
