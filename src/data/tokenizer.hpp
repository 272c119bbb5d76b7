#pragma once
// The tokenizer interface shared by BERT WordPiece (wordpiece.hpp) and GPT-2 byte-level BPE
// (bpe.hpp), and the parallel corpus tokenization behind `pipefisher tokenize --in`.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pf {

// Per-thread scratch of a tokenizer (GPT-2's BPE cache, buffers). Encoding is const and
// thread-safe as long as each thread brings its own state.
struct EncodeState {
  virtual ~EncodeState() = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;  // "bert" | "gpt2"
  virtual int vocab_size() const = 0;
  virtual std::unique_ptr<EncodeState> new_state() const = 0;
  // Appends the ids of `text` (no special tokens) to `out`.
  virtual void encode_append(std::string_view text, std::vector<int32_t>& out, EncodeState& st) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // True if encoding text[0..cut) and text[cut..) separately gives the same ids as encoding it
  // whole. Used to split a corpus for parallel tokenization without changing the result.
  virtual bool safe_cut(std::string_view text, size_t cut) const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    auto st = new_state();
    std::vector<int32_t> out;
    encode_append(text, out, *st);
    return out;
  }
};

// "bert" -> vocab_dir/bert-base-uncased.txt, "gpt2" -> vocab_dir/gpt2-encoder.json + gpt2-vocab.bpe.
// Throws UsageError naming the flag or file on an unknown name, a missing or malformed file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name, const std::string& vocab_dir);
// The files load_tokenizer(name, vocab_dir) reads (inputs no output may name).
std::vector<std::string> tokenizer_files(const std::string& name, const std::string& vocab_dir);

// The directory holding vocabulary `name`'s files when no --vocab-dir names one: beside the token
// files (`token_file`'s directory, then a vocab/ beside that directory: data/corpus/x.bin ->
// data/vocab), then the project's data/vocab (config/paths.hpp's data_candidates). UsageError
// naming --vocab-dir and every directory tried when none holds them.
std::string find_vocab_dir(const std::string& name, const std::string& token_file = "");

// Tokenizes a whole corpus text: the result equals tok.encode(text), computed in parallel over
// pieces cut at newlines where tok.safe_cut holds, and concatenated in order (deterministic).
std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, std::string_view text);

// The same ids, plus where each document starts: documents are separated by blank lines (the
// corpus layout, scripts/fetch-data.sh); doc_starts[k] is the first token of document k (strictly
// increasing, starting at 0; a document that tokenizes to nothing is left out). A blank line where
// tok.safe_cut does not hold does not separate documents.
struct TokenizedCorpus {
  std::vector<int32_t> ids;
  std::vector<int64_t> doc_starts;
};
// Text that is not UTF-8 is refused first: UsageError("<what>: invalid UTF-8 near byte N"), N
// counted from the start of the whole text.
TokenizedCorpus tokenize_documents(const Tokenizer& tok, std::string_view text, const std::string& what = "text");

}  // namespace pf
