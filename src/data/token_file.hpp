#pragma once
// Token files: raw little-endian uint16 ids, extension .bin, no header (so a file is valid when it
// has an even, non-zero number of bytes and every id is inside the vocabulary). A vocabulary
// larger than 65,536 entries cannot be stored and is refused. Runs read them through a read-only
// memory map, so a corpus larger than memory trains: the kernel pages the windows in and out.
#include "core/files.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pf {

constexpr int kMaxTokenFileVocab = 65536;

// A token file's ids, read in place: a read-only map of the file, or a vector's (tests, and the
// copies read_token_file makes). Copies share the ids.
class Tokens {
 public:
  Tokens() = default;
  Tokens(std::vector<uint16_t> ids);  // NOLINT(google-explicit-constructor): a vector is a token list
  Tokens(std::shared_ptr<const void> owner, const uint16_t* ids, int64_t count)
      : owner_(std::move(owner)), ids_(ids), n_(count) {}
  int64_t size() const { return n_; }
  uint16_t operator[](int64_t i) const { return ids_[i]; }
  std::span<const uint16_t> span() const { return {ids_, static_cast<size_t>(n_)}; }

 private:
  std::shared_ptr<const void> owner_;  // the mapping or the vector
  const uint16_t* ids_ = nullptr;
  int64_t n_ = 0;
};

// Maps a token file read-only and checks it before any use. UsageError naming `key` (e.g.
// data.train_file; empty: the file alone) and the file when it is missing, not a regular file (a
// directory, a FIFO, a device), empty, has an odd number of bytes, cannot be mapped (ulimit -v),
// or holds an id >= vocab_size (the first one, with its position). Holes of a sparse file read
// as id 0 and are not scanned.
Tokens map_token_file(const std::string& path, int vocab_size, const std::string& key = "");

// Writes ids through an OutputWriter (core/files.hpp: a temporary renamed into place). UsageError
// naming the file if vocab_size > 65,536, an id is outside [0, vocab_size), or it cannot be written.
void write_token_file(const OutputFile& out, std::span<const int32_t> ids, int vocab_size);
void write_token_file(const std::string& path, std::span<const int32_t> ids, int vocab_size);

// A copy of a whole token file (small files: tests, tools), checked as map_token_file does.
std::vector<uint16_t> read_token_file(const std::string& path, int vocab_size);

// Document index of a token file (BERT's next-sentence pairs come from documents): where each
// document starts, one decimal token offset per line, `X.docs` beside `X.bin`
// (scripts/prepare-data.sh writes it with `pipefisher tokenize --docs`). Written atomically.
void write_doc_index(const OutputFile& out, std::span<const int64_t> starts);
void write_doc_index(const std::string& path, std::span<const int64_t> starts);
// Reads it back. UsageError naming `key` and the file if it is missing, or its offsets are not
// strictly increasing from 0 and below n_tokens.
std::vector<int64_t> read_doc_index(const std::string& path, int64_t n_tokens, const std::string& key);
// The index's name for a token file: X.bin -> X.docs.
std::string doc_index_path(const std::string& token_file);

}  // namespace pf
