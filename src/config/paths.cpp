#include "config/paths.hpp"

#include <algorithm>
#include <filesystem>

namespace pf {

namespace fs = std::filesystem;

std::string absolute_path(const std::string& path, const std::string& base) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  std::error_code ec;
  const fs::path dir = base.empty() ? fs::current_path(ec) : fs::absolute(base, ec);
  if (ec) return path;  // no current directory (removed): the path as given is all there is
  return (dir / path).lexically_normal().string();
}

std::vector<std::string> data_candidates(const std::string& rel) {
  std::vector<std::string> out{absolute_path("data/" + rel)};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::string built = (exe.parent_path().parent_path() / "data" / rel).lexically_normal().string();
    if (std::find(out.begin(), out.end(), built) == out.end()) out.push_back(built);
  }
#ifdef PF_DATA_SOURCE_DIR
  // An installed or copied program still finds the data of the tree it was built from.
  const std::string source = (fs::path(PF_DATA_SOURCE_DIR) / "data" / rel).lexically_normal().string();
  if (std::find(out.begin(), out.end(), source) == out.end()) out.push_back(source);
#endif
  return out;
}

std::string find_data(const std::string& rel) {
  const std::vector<std::string> c = data_candidates(rel);
  std::error_code ec;
  for (const std::string& p : c)
    if (fs::exists(p, ec)) return p;
  return c.front();
}

}  // namespace pf
