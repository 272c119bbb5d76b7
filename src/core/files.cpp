#include "core/files.hpp"

#include "core/error.hpp"

#include <cstdio>
#include <filesystem>
#include <unistd.h>

namespace pf {

void write_file_atomic(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) usage_error(path, "cannot write");
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    usage_error(path, "write failed");
  }
}

void make_dirs(const std::string& path, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) usage_error(what, "cannot create directory '{}': {}", path, ec.message());
}

}  // namespace pf
