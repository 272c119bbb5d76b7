// Bad input: every loader refuses malformed, truncated or oversized input with a UsageError (a
// one-line message naming the file or key), never another exception. The first tests are the
// regressions of what the fuzzers (fuzz/, scripts/fuzz.sh) found.
#include "config/config.hpp"
#include "core/error.hpp"
#include "data/bpe.hpp"
#include "data/token_file.hpp"
#include "data/wordpiece.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "schedule/schedule.hpp"
#include "sim/profile.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace {

namespace fs = std::filesystem;

fs::path file(const std::string& name, const std::string& bytes) {
  const fs::path d = pf_test::scratch_dir("bad_input");
  std::ofstream(d / name, std::ios::binary) << bytes;
  return d / name;
}

// Throws a UsageError whose message contains `what` (and nothing else escapes).
void expect_refused(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected a refusal mentioning '" << what << "'";
  } catch (const pf::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
  }
}

// fuzz_schedule: numbers beyond int made std::stoi throw std::out_of_range (the CLI exited 1
// with "stoi" instead of naming the file), in the header, a device cell and an action token.
TEST(FuzzRegressions, ScheduleNumbersTooLarge) {
  expect_refused([] { pf::parse_csv("# pipefisher schedule name=gpipe devices=1 stages=2999999999999999999 pipelines=1 "
                                    "micro_batches=2\nde\x01", "s.csv"); },
                 "s.csv:1: header number 2999999999999999999 is too large");
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=1 stages=1 pipelines=1 micro_batches=1\n"
                                     "99999999999: 0F0\n", "s.txt"); },
                 "s.txt");
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=1 stages=1 pipelines=1 micro_batches=1\n"
                                     "0: 0F99999999999\n", "s.txt"); },
                 "number 99999999999 is too large");
  // Within int but absurd: refused before allocating per-device tables.
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=2000000000 stages=1 pipelines=1 micro_batches=1\n",
                                     "s.txt"); },
                 "too large");
}

TEST(BadInput, SafetensorsTruncatedOrLying) {
  std::string header = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  const std::string good = len + header + std::string(8, '\0');
  EXPECT_NO_THROW(pf::SafetensorsReader(file("good.safetensors", good).string()));
  expect_refused([&] { pf::SafetensorsReader(file("t.safetensors", good.substr(0, good.size() - 1)).string()); }, "t.safetensors");
  expect_refused([&] { pf::SafetensorsReader(file("h.safetensors", good.substr(0, 20)).string()); }, "h.safetensors");
  expect_refused([&] { pf::SafetensorsReader(file("e.safetensors", "").string()); }, "e.safetensors");
  std::string huge(8, '\xff');  // header length 2^64 - 1
  expect_refused([&] { pf::SafetensorsReader(file("l.safetensors", huge + "{}").string()); }, "l.safetensors");
}

TEST(BadInput, TokenFiles) {
  expect_refused([] { pf::read_token_file(file("odd.bin", "abc").string(), 30522); }, "odd.bin");
  expect_refused([] { pf::read_token_file(file("big.bin", "\xff\xff").string(), 30522); }, "big.bin");
  expect_refused([] { pf::read_token_file((fs::temp_directory_path() / "pf-absent.bin").string(), 30522); }, "pf-absent.bin");
}

TEST(BadInput, ConfigurationText) {
  expect_refused([] { pf::Config::from_toml_string("[model\nlayers = 2"); }, "");
  expect_refused([] { pf::Config::from_toml_string("[model]\nlayers = \"two\"\n"); }, "model.layers");
  expect_refused([] { pf::Config::from_toml_string("[model]\nlayers = 99999999999999999999\n"); }, "");
  expect_refused([] { pf::Config::from_toml_string("[train]\nkeep_checkpoints = 0\n").validate(); }, "train.keep_checkpoints");
}

TEST(BadInput, ProfilesAndTokenizerFiles) {
  expect_refused([] { pf::read_profile_json(file("p.json", R"({"format": "pipefisher-profile", "vers)").string()); }, "--profile");
  expect_refused([] { pf::read_paper_csv(file("p.csv", "bs,time_f\n8,1\n").string()); }, "--profile");
  expect_refused([] { pf::WordPieceTokenizer::load(file("vocab.txt", "").string()); }, "vocab.txt");
  expect_refused([] { pf::Gpt2Tokenizer::load(file("enc.json", "{\"a\": ").string(), file("v.bpe", "#version: 0.2\n").string()); },
                 "enc.json");
}

}  // namespace
