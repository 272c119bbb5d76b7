// GPT-2 byte-level BPE against known GPT-2 encodings, and exact round trips.
#include "core/error.hpp"
#include "data/seq_rng.hpp"
#include "data/text_util.hpp"
#include "data/vocab_info.hpp"
#include "vocab_fixture.hpp"

using Ids = std::vector<int32_t>;

namespace pf {
namespace {

using Gpt2Test = test::VocabTest;

TEST_F(Gpt2Test, KnownEncodings) {
  EXPECT_EQ(gpt2().encode("Hello, my dog is cute"), (Ids{15496, 11, 616, 3290, 318, 13779}));
  EXPECT_EQ(gpt2().encode("hello world"), (Ids{31373, 995}));
  EXPECT_EQ(gpt2().vocab_size(), kGpt2Vocab.size);
  EXPECT_EQ(gpt2().eot_id(), kGpt2Vocab.eot);
}

TEST_F(Gpt2Test, NewlineRunsFollowThePattern) {
  // "\n" is token 198 and "\n\n" 628. Between two words \s+(?!\S) cannot take both newlines (the
  // second is followed by a letter), so they stay apart; at the end of the text they merge.
  ASSERT_EQ(gpt2().id("\u010A"), 198);
  ASSERT_EQ(gpt2().id("\u010A\u010A"), 628);
  EXPECT_EQ(gpt2().encode("a\n\nb"), (Ids{64, 198, 198, 65}));
  EXPECT_EQ(gpt2().encode("a\n\n"), (Ids{64, 628}));
}

TEST_F(Gpt2Test, RoundTripsArbitraryUtf8) {
  const std::vector<std::string> texts = {
      "Héllo wörld — “quoted” naïve café",
      "日本語のテキストと中文",
      "emoji 😀🎉👩‍👩‍👧 flags 🇫🇷",
      "tabs\tand\n\nnewlines   trailing spaces   \n",
      "  leading spaces, 123 numbers 4.5e-6 and symbols #$%^&*()_+",
      "Ελληνικά ΟΔΟΣ русский текст עברית العربية",
      "\u0001\u007F control \u200B zero width \uFEFF bom",
      "",
  };
  for (const auto& t : texts) {
    Ids ids = gpt2().encode(t);
    EXPECT_EQ(gpt2().decode(ids), t) << t;
  }
  // Random code points from every plane in use (no surrogates), seeded.
  SeqRng rng{12345};
  for (int n = 0; n < 200; ++n) {
    std::string s;
    int len = 1 + static_cast<int>(rng.below(40));
    for (int k = 0; k < len; ++k) {
      uint64_t kind = rng.below(4);
      int32_t c = kind == 0 ? static_cast<int32_t>(rng.below(0x80))
                  : kind == 1 ? static_cast<int32_t>(0x80 + rng.below(0x800 - 0x80))
                  : kind == 2 ? static_cast<int32_t>(0x800 + rng.below(0xD800 - 0x800))
                              : static_cast<int32_t>(0x10000 + rng.below(0x30000));
      append_utf8(s, c);
    }
    ASSERT_EQ(gpt2().decode(gpt2().encode(s)), s) << "case " << n;
  }
}

TEST_F(Gpt2Test, SafeCutsDoNotChangeTheEncoding) {
  // Every position the tokenizer calls safe must split the text into two independently
  // encodable halves.
  const std::string sample = test::slurp(test::source_dir() + "/data/sample/moby-dick-1-20.txt");
  const std::string text = "x\ny\n\nz\n\n\nw \n v\t\nu  \n\nt\n" + sample.substr(0, 20000) + "\n\n\nEnd.\n";
  const Ids whole = gpt2().encode(text);
  int cuts = 0;
  for (size_t c = 0; c <= text.size(); ++c) {
    if (!gpt2().safe_cut(text, c)) continue;
    ++cuts;
    Ids parts = gpt2().encode(std::string_view(text).substr(0, c));
    Ids rest = gpt2().encode(std::string_view(text).substr(c));
    parts.insert(parts.end(), rest.begin(), rest.end());
    ASSERT_EQ(parts, whole) << "cut at byte " << c;
  }
  EXPECT_GT(cuts, 20);
}

TEST_F(Gpt2Test, CorpusTokenizationEqualsWholeEncoding) {
  const std::string text = test::slurp(test::source_dir() + "/data/sample/moby-dick-1-20.txt");
  ASSERT_GT(text.size(), 100000u);
  EXPECT_EQ(tokenize_corpus(gpt2(), text), gpt2().encode(text));
}

TEST_F(Gpt2Test, InvalidUtf8IsAUsageError) {
  EXPECT_THROW(gpt2().encode("abc \xff\xfe def"), UsageError);
}

}  // namespace
}  // namespace pf
