#pragma once
// Token files: raw little-endian uint16 ids, extension .bin, no header. A vocabulary larger than
// 65,536 entries cannot be stored and is refused.
#include "core/files.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pf {

constexpr int kMaxTokenFileVocab = 65536;

// Writes ids through an OutputWriter (core/files.hpp: a temporary renamed into place). UsageError
// naming the file if vocab_size > 65,536, an id is outside [0, vocab_size), or it cannot be written.
void write_token_file(const OutputFile& out, std::span<const int32_t> ids, int vocab_size);
void write_token_file(const std::string& path, std::span<const int32_t> ids, int vocab_size);

// Reads a whole token file. UsageError naming the file if it cannot be read, has an odd number
// of bytes, or holds an id >= vocab_size.
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
