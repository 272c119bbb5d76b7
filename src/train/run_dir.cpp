#include "train/run_dir.hpp"

#include "train/checkpointing.hpp"

#include <filesystem>

namespace pf {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// A checkpoint directory (train.checkpoint_dir): `latest`, or a step-N directory in it.
bool holds_checkpoints(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir / "latest", ec))) return true;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

// "" for a path that is not there.
std::string existing(const fs::path& p) { return is_file(p) ? p.string() : std::string(); }

}  // namespace

std::string run_config_of(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec).lexically_normal();
  if (ec) return "";
  const fs::path dir = p.has_filename() ? p : p.parent_path();  // "RUN/" as "RUN"
  if (!fs::is_directory(dir, ec)) return existing(dir.parent_path() / "config.toml");
  if (is_file(dir / "config.toml")) return (dir / "config.toml").string();
  if (is_file(dir / "manifest.json") || dir.filename().string().rfind("step-", 0) == 0)
    return existing(dir.parent_path().parent_path() / "config.toml");
  return holds_checkpoints(dir) ? existing(dir.parent_path() / "config.toml") : "";
}

std::string run_weights_of(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !fs::is_directory(path, ec) || !is_file(fs::path(path) / "config.toml")) return path;
  const fs::path run(path);
  if (is_file(run / "model.safetensors")) return (run / "model.safetensors").string();
  if (fs::is_directory(run / "checkpoints", ec)) return (run / "checkpoints").string();
  return path;
}

std::string resume_dir_of(const std::string& path, const Config& cfg) {
  std::error_code ec;
  if (path.empty() || !fs::is_directory(path, ec) || !is_file(fs::path(path) / "config.toml")) return path;
  return checkpoint_dir_of(cfg);
}

std::string config_for(const std::string& config_flag, const std::string& path) {
  return config_flag.empty() ? run_config_of(path) : config_flag;
}

}  // namespace pf
