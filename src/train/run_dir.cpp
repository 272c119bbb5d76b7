#include "train/run_dir.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/hf_model.hpp"
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

namespace {

// A folder Hugging Face's save_pretrained wrote (or ours without its config.toml). Its config.json
// need only be there: one that is no file (a FIFO) is refused as such when read, not taken for a
// checkpoint directory.
bool hf_folder(const std::string& path) {
  std::error_code ec;
  const fs::path dir(path);
  return !path.empty() && fs::is_directory(dir, ec) && !is_file(dir / "config.toml") &&
         fs::exists(fs::symlink_status(dir / "config.json", ec)) && is_file(dir / "model.safetensors");
}

// A Hugging Face folder with pickled weights only: unpickling runs code, so they are not read.
void refuse_pickled_folder(const std::string& path) {
  std::error_code ec;
  const fs::path dir(path);
  if (path.empty() || !fs::is_directory(dir, ec) || is_file(dir / "model.safetensors")) return;
  for (const char* name : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
    if (fs::exists(fs::symlink_status(dir / name, ec)))
      usage_error("--init", "'{}' holds {}, PyTorch's pickled weights, which are not read (unpickling runs code): convert "
                  "them to model.safetensors beside config.json, e.g. with transformers: AutoModelForMaskedLM (BERT) or "
                  "AutoModelForCausalLM (GPT-2) .from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)",
                  path, name);
}

}  // namespace

std::string run_weights_of(const std::string& path) {
  std::error_code ec;
  if (hf_folder(path)) return (fs::path(path) / "model.safetensors").string();
  if (path.empty() || !fs::is_directory(path, ec) || !is_file(fs::path(path) / "config.toml")) return path;
  const fs::path run(path);
  if (is_file(run / "model.safetensors")) return (run / "model.safetensors").string();
  if (fs::is_directory(run / "checkpoints", ec)) return (run / "checkpoints").string();
  return path;
}

std::vector<std::string> init_model_sets(const std::string& path) {
  refuse_pickled_folder(path);
  if (!hf_folder(path)) return {};
  const std::string file = (fs::path(path) / "config.json").string();
  return hf_model_sets(read_input_file(file, "--init", 1 << 20), file);
}

std::string resume_dir_of(const std::string& path, const Config& cfg) {
  std::error_code ec;
  if (path.empty() || !fs::is_directory(path, ec) || !is_file(fs::path(path) / "config.toml")) return path;
  return checkpoint_dir_of(cfg);
}

std::string run_dir_of_resume(const std::string& resume) {
  const std::string config = run_config_of(resume);
  return config.empty() ? "" : fs::path(config).parent_path().string();
}

std::string run_dir_of_config(const std::string& config) {
  std::error_code ec;
  const fs::path p = fs::absolute(config, ec).lexically_normal();
  if (config.empty() || ec || p.filename() != "config.toml" || !is_file(p)) return "";
  const fs::path dir = p.parent_path();
  const bool run = is_file(dir / "log.jsonl") || fs::exists(fs::symlink_status(dir / ".pipefisher-lock", ec));
  return run ? dir.string() : "";
}

namespace {

// `path` under `from` (both absolute and normal) moved under `to`; other paths unchanged.
std::string rebased(const std::string& path, const fs::path& from, const fs::path& to) {
  if (path.empty()) return path;
  const fs::path rel = fs::path(path).lexically_relative(from);
  if (rel.empty() || *rel.begin() == "..") return path;
  if (rel == ".") return to.string();
  return (to / rel).lexically_normal().string();
}

}  // namespace

void relocate_run(Config& cfg, const std::string& run_dir, bool log_given) {
  std::error_code ec;
  const fs::path from = fs::absolute(cfg.train.out_dir, ec).lexically_normal();
  const fs::path to = fs::absolute(run_dir, ec).lexically_normal();
  if (from == to || fs::equivalent(from, to, ec)) return;
  const std::string& log = cfg.train.log_json;
  const bool log_outside = !log.empty() && rebased(log, from, to) == log;
  if (log_outside && !log_given && fs::exists(from, ec))
    usage_error("train.log_json", "'{}' is the log of the run in '{}', which '{}' is a copy of: give this run its own "
                "(--log-json FILE)", log, from.string(), to.string());
  for (std::string* p : {&cfg.train.log_json, &cfg.train.checkpoint_dir, &cfg.kfac.plan_profile,
                         &cfg.parallel.schedule_file, &cfg.data.train_file, &cfg.data.valid_file})
    *p = rebased(*p, from, to);
  cfg.train.out_dir = to.string();
}

std::string config_for(const std::string& config_flag, const std::string& path) {
  return config_flag.empty() ? run_config_of(path) : config_flag;
}

}  // namespace pf
