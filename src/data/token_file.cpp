#include "data/token_file.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "config/limits.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
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

Tokens::Tokens(std::vector<uint16_t> ids) {
  auto owned = std::make_shared<const std::vector<uint16_t>>(std::move(ids));
  ids_ = owned->data();
  n_ = static_cast<int64_t>(owned->size());
  owner_ = std::move(owned);
}

namespace {

// The file's name in errors: "key: 'path'", or the path alone.
std::string token_file_what(const std::string& path, const std::string& key) {
  return key.empty() ? path : fmt::format("{}: '{}'", key, path);
}

// The first id >= vocab_size in ids[lo, hi), or -1. Chunks are checked by their maximum (a loop
// the compiler vectorizes) and only a failing chunk is searched.
int64_t first_out_of_vocab(const uint16_t* ids, int64_t lo, int64_t hi, int vocab_size) {
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t e = std::min(hi, c + kChunk);
    uint16_t m = 0;
    for (int64_t i = c; i < e; ++i) m = std::max(m, ids[i]);
    if (m >= vocab_size)
      for (int64_t i = c; i < e; ++i)
        if (ids[i] >= vocab_size) return i;
  }
  return -1;
}

// Checks every id of the mapped file against the vocabulary, skipping the holes of a sparse file
// (they read as 0, always a valid id): lseek's SEEK_DATA / SEEK_HOLE name the extents holding data.
void check_ids(int fd, const uint16_t* ids, int64_t bytes, int vocab_size, const std::string& what) {
  for (int64_t pos = 0; pos < bytes;) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole from here on
    off_t hole = data < 0 ? bytes : ::lseek(fd, data, SEEK_HOLE);
    if (data < 0) data = pos;  // no SEEK_DATA on this file system: scan everything
    if (hole < 0 || hole > bytes) hole = bytes;
    const int64_t lo = data / 2, hi = (hole + 1) / 2;
    const int64_t bad = first_out_of_vocab(ids, lo, hi, vocab_size);
    if (bad >= 0)
      usage_error(what, "token id {} at position {} is >= the vocabulary size {} (wrong vocabulary?)", ids[bad], bad,
                  vocab_size);
    pos = std::max<int64_t>(hole, pos + 1);
  }
}

}  // namespace

Tokens map_token_file(const std::string& path, int vocab_size, const std::string& key) {
  static_assert(std::endian::native == std::endian::little, "token files are read in place as little-endian ids");
  const std::string what = token_file_what(path, key);
  // O_NONBLOCK: opening a FIFO waits for a writer otherwise (it is refused below, as not a regular file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) usage_error(what, "cannot read token file: {} (run scripts/prepare-data.sh?)", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) usage_error(what, "cannot stat token file: {}", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) usage_error(what, "is a directory, not a token file");
  if (!S_ISREG(st.st_mode)) usage_error(what, "is not a regular file (a token file is read through a memory map)");
  const int64_t bytes = st.st_size;
  if (bytes == 0) usage_error(what, "token file is empty");
  if (bytes % 2 != 0)
    usage_error(what, "token file has an odd number of bytes ({}): not little-endian uint16 ids", bytes);
  void* map = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED)
    usage_error(what, "cannot map the token file ({}) into memory: {}{}", format_bytes(static_cast<double>(bytes)),
                std::strerror(errno), errno == ENOMEM ? " (an address-space limit, ulimit -v?)" : "");
  std::shared_ptr<const void> owner(map, [bytes](const void* p) { ::munmap(const_cast<void*>(p), static_cast<size_t>(bytes)); });
  const auto* ids = static_cast<const uint16_t*>(map);
  check_ids(fd, ids, bytes, vocab_size, what);
  return Tokens(std::move(owner), ids, bytes / 2);
}

std::vector<uint16_t> read_token_file(const std::string& path, int vocab_size) {
  const Tokens tokens = map_token_file(path, vocab_size);
  return {tokens.span().begin(), tokens.span().end()};
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
