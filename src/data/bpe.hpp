#pragma once
// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.py, as tiktoken's "gpt2"):
//   pre-tokenisation by GPT-2's regex through PCRE2 (UTF + UCP, JIT), each chunk's UTF-8 bytes
//   mapped to printable characters by bytes_to_unicode, then pairs merged lowest rank first
//   (ranks = line order of vocab.bpe) until no ranked pair remains; chunk results are cached.
// decode(encode(s)) == s for any valid UTF-8 string.
#include "data/tokenizer.hpp"

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace pf {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // UsageError naming the file if either is missing, is not what it should be (bad JSON, an entry
  // that is not a string -> id map, a merge line without two parts or with unknown parts), or the
  // two do not fit together (a token that no merge produces: a truncated vocab.bpe).
  static Gpt2Tokenizer load(const std::string& encoder_json, const std::string& vocab_bpe);
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer() override;

  std::string name() const override { return "gpt2"; }
  int vocab_size() const override { return static_cast<int>(token_bytes_.size()); }
  std::unique_ptr<EncodeState> new_state() const override;
  void encode_append(std::string_view text, std::vector<int32_t>& out, EncodeState& st) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  bool safe_cut(std::string_view text, size_t cut) const override;

  int id(const std::string& token) const;  // token in its bytes_to_unicode spelling; -1 if absent
  int eot_id() const { return eot_; }       // <|endoftext|>

 private:
  Gpt2Tokenizer() = default;
  struct PairHash {
    size_t operator()(uint64_t k) const { return static_cast<size_t>(k * 0x9e3779b97f4a7c15ull >> 20); }
  };
  struct Merge {
    int rank;
    int32_t merged;
  };
  std::unordered_map<std::string, int32_t> encoder_;          // unicode spelling -> id
  std::vector<std::string> token_bytes_;                      // id -> raw bytes
  std::array<int32_t, 256> byte_id_{};                        // id of each single byte
  std::unordered_map<uint64_t, Merge, PairHash> merges_;      // (left id, right id) -> rank, result
  int eot_ = -1;
  void* regex_ = nullptr;  // pcre2_code* (JIT-compiled)

  void bpe(std::string_view chunk, std::vector<int32_t>& out) const;
  // The parts of load(): encoder.json's tokens and the single bytes' ids, then vocab.bpe's merges.
  void read_encoder(const std::string& encoder_json);
  void read_merges(const std::string& vocab_bpe, const std::string& encoder_json);
};

}  // namespace pf
