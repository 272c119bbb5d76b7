#pragma once
// Token files: raw little-endian uint16 ids, extension .bin, no header. A vocabulary larger than
// 65,536 entries cannot be stored and is refused.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pf {

constexpr int kMaxTokenFileVocab = 65536;

// Writes ids to `path` through a temporary file renamed into place. UsageError naming the file
// if vocab_size > 65,536, an id is outside [0, vocab_size), or the file cannot be written.
void write_token_file(const std::string& path, std::span<const int32_t> ids, int vocab_size);

// Reads a whole token file. UsageError naming the file if it cannot be read, has an odd number
// of bytes, or holds an id >= vocab_size.
std::vector<uint16_t> read_token_file(const std::string& path, int vocab_size);

}  // namespace pf
