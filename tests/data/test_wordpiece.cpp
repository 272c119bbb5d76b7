// BERT WordPiece against known bert-base-uncased encodings (HF's BertTokenizer).
#include "data/vocab_info.hpp"
#include "vocab_fixture.hpp"

#include "core/error.hpp"

using pf::test::VocabTest;
using Strings = std::vector<std::string>;
using Ids = std::vector<int32_t>;

namespace pf {
namespace {

using BertTest = VocabTest;

TEST_F(BertTest, KnownEncodings) {
  EXPECT_EQ(bert().encode_with_special("Hello world!"), (Ids{101, 7592, 2088, 999, 102}));
  EXPECT_EQ(bert().tokenize("unaffable"), (Strings{"una", "##ffa", "##ble"}));
  EXPECT_EQ(bert().tokenize("Hello, my dog is cute"), (Strings{"hello", ",", "my", "dog", "is", "cute"}));
  EXPECT_EQ(bert().tokenize("don't"), (Strings{"don", "'", "t"}));
}

TEST_F(BertTest, SpecialIdsMatchVocabInfo) {
  EXPECT_EQ(bert().vocab_size(), kBertVocab.size);
  EXPECT_EQ(bert().pad_id(), kBertVocab.pad);
  EXPECT_EQ(bert().unk_id(), kBertVocab.unk);
  EXPECT_EQ(bert().cls_id(), kBertVocab.cls);
  EXPECT_EQ(bert().sep_id(), kBertVocab.sep);
  EXPECT_EQ(bert().mask_id(), kBertVocab.mask);
  EXPECT_EQ(bert().token(1), "[unused0]");
}

TEST_F(BertTest, LowerCasesAndStripsAccents) {
  EXPECT_EQ(bert().tokenize("Héllo"), (Strings{"hello"}));
  EXPECT_EQ(bert().tokenize("He\u0301llo"), (Strings{"hello"}));  // decomposed input, same result
  EXPECT_EQ(bert().tokenize("naïve café"), (Strings{"naive", "cafe"}));
  EXPECT_EQ(bert().tokenize("ÉCOLE CAFÉ"), (Strings{"ecole", "cafe"}));
}

TEST_F(BertTest, PunctuationIncludesAsciiSymbols) {
  // $ and + are Unicode symbols (Sc, Sm), but BERT splits every non-alphanumeric ASCII character.
  EXPECT_EQ(bert().tokenize("$5+3"), (Strings{"$", "5", "+", "3"}));
}

TEST_F(BertTest, CjkCharactersAreSeparateTokens) {
  EXPECT_EQ(bert().encode("中国的"), (Ids{1746, 1799, 1916}));
  EXPECT_EQ(bert().tokenize("a中b"), (Strings{"a", "中", "b"}));
}

TEST_F(BertTest, CleansControlAndFormatCharacters) {
  EXPECT_EQ(bert().tokenize("a\u0001b"), (Strings{"ab"}));  // control: dropped
  EXPECT_EQ(bert().tokenize("a\u200Bb"), (Strings{"ab"}));  // zero-width space is Cf: dropped
  EXPECT_EQ(bert().tokenize("a\u00A0b\tc\r\nd"), (Strings{"a", "b", "c", "d"}));  // whitespace
}

TEST_F(BertTest, UnknownAndOverlongWords) {
  EXPECT_EQ(bert().encode("😀"), (Ids{100}));
  EXPECT_EQ(bert().encode(std::string(101, 'a')), (Ids{100}));  // over 100 characters
  Ids hundred = bert().encode(std::string(100, 'a'));
  EXPECT_GT(hundred.size(), 1u);
  EXPECT_EQ(std::count(hundred.begin(), hundred.end(), 100), 0);
}

TEST_F(BertTest, DecodeGivesLowerCasedAccentStrippedText) {
  EXPECT_EQ(bert().decode(bert().encode_with_special("Hello world!")), "hello world!");
  EXPECT_EQ(bert().decode(bert().encode("Héllo, World! It's naïve.")), "hello, world! it's naive.");
  EXPECT_EQ(bert().decode(bert().encode("unaffable")), "unaffable");
}

TEST_F(BertTest, CorpusTokenizationEqualsWholeEncoding) {
  const std::string text = test::slurp(test::source_dir() + "/data/sample/moby-dick-1-20.txt");
  ASSERT_GT(text.size(), 100000u);
  EXPECT_EQ(tokenize_corpus(bert(), text), bert().encode(text));
}

TEST_F(BertTest, RejectsIdsOutsideVocabularyOnDecode) {
  Ids bad{7592, 30522};
  EXPECT_THROW(bert().decode(bad), UsageError);
}

}  // namespace
}  // namespace pf
