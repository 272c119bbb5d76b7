#pragma once
// BERT's WordPiece tokenizer (bert-base-uncased), reproducing Hugging Face's BertTokenizer:
//   BasicTokenizer: drop NUL, U+FFFD and control characters, map whitespace to ' ', put spaces
//   around CJK ideographs, split on whitespace, lower-case, NFD + drop non-spacing marks (Mn),
//   split off every punctuation character (ASCII symbols count, as in BERT);
//   WordpieceTokenizer: greedy longest match from the left, continuations spelled "##piece",
//   a word longer than 100 code points or with an unmatchable rest becomes [UNK].
// Special tokens written in the text ("[CLS]") are not recognised: they are text like any other.
#include "data/tokenizer.hpp"

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pf {

class WordPieceTokenizer final : public Tokenizer {
 public:
  // vocab.txt: one token per line, id = line number (0-based). UsageError naming the file if it
  // cannot be read, is empty, has duplicates, or lacks [PAD] [UNK] [CLS] [SEP] [MASK].
  static WordPieceTokenizer load(const std::string& vocab_txt);

  std::string name() const override { return "bert"; }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  std::unique_ptr<EncodeState> new_state() const override;
  void encode_append(std::string_view text, std::vector<int32_t>& out, EncodeState& st) const override;
  // As HF's decode(ids, skip_special_tokens=True): join pieces with spaces, glue "##"
  // continuations, then HF's clean_up_tokenization (" ." -> ".", " n't" -> "n't", ...).
  std::string decode(std::span<const int32_t> ids) const override;
  bool safe_cut(std::string_view text, size_t cut) const override;

  // encode with [CLS] ... [SEP] around it, as HF's tokenizer(text)["input_ids"].
  std::vector<int32_t> encode_with_special(std::string_view text) const;
  // The word pieces as strings (HF's tokenize()).
  std::vector<std::string> tokenize(std::string_view text) const;

  int id(std::string_view token) const;  // -1 if absent
  const std::string& token(int id) const { return tokens_.at(id); }
  int pad_id() const { return pad_; }
  int unk_id() const { return unk_; }
  int cls_id() const { return cls_; }
  int sep_id() const { return sep_; }
  int mask_id() const { return mask_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int, Hash, std::equal_to<>> ids_;
  int pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;

  void wordpiece(std::string_view word, const std::vector<uint32_t>& cut, std::string& key,
                 std::vector<int32_t>& out) const;
};

}  // namespace pf
