#include "data/token_file.hpp"

#include "core/error.hpp"
#include "core/files.hpp"

#include <bit>
#include <fstream>
#include <string>

namespace pf {
namespace {
uint16_t to_le(uint16_t v) {
  if constexpr (std::endian::native == std::endian::big) return static_cast<uint16_t>((v >> 8) | (v << 8));
  return v;
}
}  // namespace

void write_token_file(const OutputFile& out, std::span<const int32_t> ids, int vocab_size) {
  if (vocab_size > kMaxTokenFileVocab)
    usage_error(out.path, "vocabulary of {} entries does not fit uint16 token ids (at most {})", vocab_size,
                kMaxTokenFileVocab);
  std::vector<uint16_t> buf(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size)
      usage_error(out.path, "token id {} at position {} is outside the vocabulary (size {})", ids[i], i, vocab_size);
    buf[i] = to_le(static_cast<uint16_t>(ids[i]));
  }
  OutputWriter w(out);
  w.write(buf.data(), buf.size() * 2);
  w.commit();
}

void write_token_file(const std::string& path, std::span<const int32_t> ids, int vocab_size) {
  write_token_file(OutputFile{path}, ids, vocab_size);
}

std::vector<uint16_t> read_token_file(const std::string& path, int vocab_size) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) usage_error(path, "cannot read token file (run scripts/prepare-data.sh?)");
  const auto bytes = static_cast<size_t>(f.tellg());
  if (bytes % 2 != 0)
    usage_error(path, "token file has an odd number of bytes ({}): not little-endian uint16 ids", bytes);
  std::vector<uint16_t> ids(bytes / 2);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(bytes));
  if (!f) usage_error(path, "read error");
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = to_le(ids[i]);
    if (ids[i] >= vocab_size)
      usage_error(path, "token id {} at position {} is >= the vocabulary size {} (wrong vocabulary?)", ids[i], i,
                  vocab_size);
  }
  return ids;
}

}  // namespace pf

namespace pf {

void write_doc_index(const OutputFile& out, std::span<const int64_t> starts) {
  std::string text;
  for (int64_t s : starts) text += std::to_string(s) + "\n";
  write_output(out, text);
}

void write_doc_index(const std::string& path, std::span<const int64_t> starts) {
  write_doc_index(OutputFile{path}, starts);
}

std::vector<int64_t> read_doc_index(const std::string& path, int64_t n_tokens, const std::string& key) {
  std::ifstream f(path);
  if (!f)
    usage_error(key, "no document index '{}' (data.nsp = true needs it; scripts/prepare-data.sh writes it)", path);
  std::vector<int64_t> starts;
  std::string line;
  for (int ln = 1; std::getline(f, line); ++ln) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(line, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != line.size() || v < 0 || v >= n_tokens ||
        (starts.empty() ? v != 0 : v <= starts.back()))
      usage_error(key, "{}:{}: '{}' is not a document start (offsets rise strictly from 0, below {} tokens)", path, ln,
                  line, n_tokens);
    starts.push_back(v);
  }
  if (starts.empty()) usage_error(key, "document index '{}' is empty", path);
  return starts;
}

std::string doc_index_path(const std::string& token_file) {
  const std::string ext = ".bin";
  const bool bin = token_file.size() > ext.size() && token_file.ends_with(ext);
  return (bin ? token_file.substr(0, token_file.size() - ext.size()) : token_file) + ".docs";
}

}  // namespace pf
