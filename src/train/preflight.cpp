#include "train/preflight.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "data/token_file.hpp"
#include "io/checkpoint.hpp"
#include "train/checkpointing.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

namespace pf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".pipefisher-lock";
constexpr const char* kOwnerName = "owner.json";  // in the checkpoint directory
constexpr size_t kMaxOwnerBytes = 1 << 16;

// The files a training run writes into train.out_dir.
constexpr const char* kRunFiles[] = {"config.toml",       "config.json",       "log.jsonl",         "metrics.csv",
                                     "model.safetensors", "summary.json",      "activations.json",  "kfac_refresh.json",
                                     "kfac_profile.json", "soap_refresh.json", "soap_profile.json", "dkfac.json"};

// Those and the lock: everything the run names in out_dir (core/files.hpp's rule: regular files).
std::vector<std::string> out_dir_files() {
  std::vector<std::string> names(std::begin(kRunFiles), std::end(kRunFiles));
  names.push_back(kLockName);
  return names;
}

// Creates and removes a file in `dir` (an existing directory): the one test of writability that
// also holds for root, read-only mounts and full inode tables.
void probe_dir(const fs::path& dir, const std::string& what, const std::string& target) {
  const fs::path probe = dir / fmt::format(".pipefisher-probe-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    usage_error(what, "cannot write '{}': {} (in '{}')", target, std::strerror(e), dir.string());
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// A directory the run will make if missing: it, or its nearest existing ancestor, must be a
// writable directory.
void check_dir(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) usage_error(what, "bad path '{}': {}", path, ec.message());
  for (fs::path at = p;; at = at.parent_path()) {
    const fs::file_status st = fs::status(at, ec);
    if (fs::exists(st)) {
      if (!fs::is_directory(st))
        usage_error(what, "cannot make directory '{}': '{}' is not a directory", path, at.string());
      probe_dir(at, what, path);
      return;
    }
    if (at == at.parent_path()) usage_error(what, "cannot make directory '{}'", path);
  }
}

// A file written whole (or opened for writing): core/files.hpp's rule; if it goes to a temporary
// renamed over it, its directory must exist and be writable (or be `made`, a directory the run
// makes first: out_dir); if it is written in place (a device the user named), it must open for
// writing. Nothing is truncated.
void check_file(const OutputFile& f, const std::string& made) {
  if (f.path.empty()) return;
  const std::string& path = f.path;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  if (ec) usage_error(f.what, "bad path '{}': {}", path, ec.message());
  if (check_output(f) == OutputMode::in_place) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int e = errno;
      usage_error(f.what, "cannot write '{}': {}", path, e == ENXIO ? "a FIFO that no process reads" : std::strerror(e));
    }
    ::close(fd);
    return;
  }
  const fs::path dir = p.parent_path();
  if (!fs::is_directory(dir, ec)) {
    if (!made.empty() && (dir / "").lexically_normal() == (fs::absolute(made, ec) / "").lexically_normal()) {
      check_dir(made, f.what);
      return;
    }
    usage_error(f.what, "cannot write '{}': no directory '{}'", path, dir.string());
  }
  probe_dir(dir, f.what, path);  // a file is written under a temporary name and renamed
  if (fs::exists(p, ec) && ::access(p.c_str(), W_OK) != 0) {
    const int e = errno;
    usage_error(f.what, "cannot write '{}': {}", path, std::strerror(e));
  }
}

// Refuses the directory `dir` whose lock `fd` another live run holds (closes fd).
[[noreturn]] void refuse_in_use(int fd, const std::string& dir, const std::string& what) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  ::close(fd);
  usage_error(what, "'{}' is in use by another run ({}); give each run its own", dir,
              holder.empty() ? "its lock is held" : holder);
}

// Refuses `dir` when a live run holds its lock; creates nothing (no lock file: nobody holds it).
void check_not_locked(const std::string& dir, const std::string& what) {
  const std::string path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) refuse_in_use(fd, dir, what);
  ::close(fd);  // and with it this probe's lock
}

int take_lock(const std::string& dir, const std::string& what) {
  make_dirs(dir, what);
  const std::string path = (fs::path(dir) / kLockName).string();
  const int fd = open_output({path, what}, O_RDWR);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) refuse_in_use(fd, dir, what);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = fmt::format("pid {} on host {}\n", ::getpid(), host);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The holder's name is for the other run's message only: the lock holds without it.
  }
  return fd;
}

// The keys a run may change and still continue (Trainer's resume_from_checkpoint takes new
// logging and output arguments too): its length and its schedule's, and how it runs and reports
// rather than what it trains (the thread count, where and how often it logs, evaluates and
// checkpoints). A new thread count changes the bits of the steps after it (README: determinism).
// train.out_dir too: out_dir's own config.toml records where the run was written, which differs
// from out_dir only for a copied or moved run (continued where it now is: run_dir.hpp).
const std::vector<std::string> kContinuingKeys = {"train.steps",       "optim.decay_steps", "train.threads",
                                                  "train.log_json",    "train.log_every",   "train.eval_every",
                                                  "train.checkpoint_every", "train.keep_checkpoints",
                                                  "train.out_dir", "model.logit_chunk_rows"};

// The first key whose value differs between the run's config.toml (theirs) and this command's,
// with both values: "'[train] steps': run has 5, this command 6"; "" when none.
std::string config_difference(const std::string& theirs, const std::string& ours,
                              const std::vector<std::string>& ignored) {
  const KeyDifference d = first_difference(theirs, ours, ignored);
  if (d.key.empty()) return "";
  const size_t dot = d.key.find('.');
  return fmt::format("'[{}] {}': run has {}, this command {}", d.key.substr(0, dot), d.key.substr(dot + 1), d.a, d.b);
}

// out_dir's config.toml, or "" when it has none.
std::string previous_config(const Config& cfg) {
  const fs::path previous = fs::path(cfg.train.out_dir) / "config.toml";
  std::error_code ec;
  if (!fs::is_regular_file(previous, ec)) return "";
  std::ifstream f(previous);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// out_dir holding the outputs of a run with another configuration is refused: a new run would
// overwrite its weights and interleave its log. One that differs only in kContinuingKeys is this
// run's, continued when it has a checkpoint (`continuing`).
void check_not_another_run(const Config& cfg, bool continuing) {
  const std::string theirs = previous_config(cfg), ours = cfg.to_toml();
  if (theirs.empty() || theirs == ours) return;
  std::string at = config_difference(theirs, ours, kContinuingKeys), why;
  if (at.empty() && !continuing) {
    at = config_difference(theirs, ours, {"train.out_dir"});
    why = fmt::format(" and no checkpoint in '{}' to continue it from", checkpoint_dir_of(cfg));
  }
  if (at.empty()) return;
  usage_error("train.out_dir", "'{}' holds the outputs of another run (its config.toml differs at {}){}; give this "
              "run its own train.out_dir, or --overwrite to replace them", cfg.train.out_dir, at, why);
}

// The checkpoint directory (made if missing) and its `latest` and lock files.
void check_checkpoint_dir(const Config& cfg) {
  const std::string ck = checkpoint_dir_of(cfg);
  // The default, out_dir/checkpoints, is under out_dir: not followed out of it. A checkpoint
  // directory elsewhere is named as train.checkpoint_dir.
  std::error_code ec;
  if (cfg.train.checkpoint_dir.empty() && fs::is_symlink(fs::symlink_status(ck, ec)))
    usage_error("train.out_dir", "'{}' is a symbolic link (set train.checkpoint_dir to write checkpoints elsewhere)", ck);
  check_dir(ck, "train.checkpoint_dir");
  const fs::path latest = fs::path(ck) / "latest";
  if (fs::exists(fs::symlink_status(latest, ec)) && !fs::is_regular_file(fs::symlink_status(latest, ec)))
    usage_error("train.checkpoint_dir", "'{}' is not a file (it names the newest checkpoint; remove it)",
                latest.string());
  check_output({(fs::path(ck) / kLockName).string(), "train.checkpoint_dir"});
  check_output({(fs::path(ck) / kOwnerName).string(), "train.checkpoint_dir"});
}

// --- what the run reads, and whose directories it writes into ---

std::string normal(const std::string& path) {
  std::error_code ec;
  return fs::absolute(path, ec).lexically_normal().string();
}

// One directory: the same inode, or (for directories not there) the same normal path.
bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec) || (fs::path(normal(a)) / "") == (fs::path(normal(b)) / "");
}

// A run's own file it reads and rewrites (preflight.hpp): out_dir's config.toml, kfac_profile.json,
// soap_profile.json.
bool is_own_file(const Config& cfg, const std::string& path) {
  std::error_code ec;
  for (const char* name : {"config.toml", "kfac_profile.json", "soap_profile.json"})
    if (fs::equivalent(path, fs::path(cfg.train.out_dir) / name, ec)) return true;
  return false;
}

// Everything the run reads: the command's inputs and the configuration's files.
std::vector<NamedPath> run_inputs(const Config& cfg, const RunOutputs& o) {
  std::vector<NamedPath> in = o.inputs;
  for (const auto& [path, key] : {std::pair{cfg.data.train_file, "data.train_file"}, {cfg.data.valid_file, "data.valid_file"}}) {
    in.push_back({path, key});
    in.push_back({doc_index_path(path), fmt::format("{}'s document index", key)});
  }
  in.push_back({cfg.parallel.schedule_file, "parallel.schedule_file"});
  in.push_back({cfg.kfac.plan_profile, "kfac.plan_profile"});
  std::error_code ec;
  // Inputs not there are read by nobody (a document index without data.nsp).
  std::erase_if(in, [&](const NamedPath& p) { return p.path.empty() || !fs::exists(p.path, ec) || is_own_file(cfg, p.path); });
  return in;
}

// An out_dir holding something (but the run's own inputs) and no run of ours, named with a few
// of its entries: a Hugging Face model folder would lose its config.json and model.safetensors.
void check_is_run_dir(const Config& cfg, const std::vector<NamedPath>& inputs) {
  const fs::path out = cfg.train.out_dir;
  std::error_code ec;
  if (!fs::is_directory(out, ec) || fs::exists(out / "config.toml", ec) ||
      fs::exists(fs::symlink_status(out / kLockName, ec)))
    return;
  std::vector<std::string> names;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const bool input = std::any_of(inputs.begin(), inputs.end(), [&](const NamedPath& p) {
      std::error_code e;
      return fs::equivalent(it->path(), p.path, e);
    });
    if (!input) names.push_back(it->path().filename().string());
  }
  if (names.empty()) return;
  std::sort(names.begin(), names.end());
  std::string listed;
  for (size_t i = 0; i < names.size() && i < 4; ++i) listed += (i ? ", " : "") + names[i];
  if (names.size() > 4) listed += fmt::format(", ... ({} entries)", names.size());
  usage_error("train.out_dir", "'{}' is not empty and not a pipefisher run directory (it holds {}): give this run a "
              "new or empty train.out_dir, or --overwrite to write into it", cfg.train.out_dir, listed);
}

// A checkpoint directory's owner.json: its run's out_dir (absolute) and id.
struct CheckpointOwner {
  std::string out_dir, run;
};

std::optional<CheckpointOwner> read_owner(const std::string& ck) {
  const fs::path file = fs::path(ck) / kOwnerName;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream f(file);
  std::string text(kMaxOwnerBytes + 1, '\0');
  text.resize(static_cast<size_t>(f.read(text.data(), static_cast<std::streamsize>(text.size())).gcount()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (text.size() > kMaxOwnerBytes || !j.is_object() || !j.contains("out_dir") || !j["out_dir"].is_string() ||
      !j.contains("run") || !j["run"].is_string())
    usage_error("train.checkpoint_dir", "'{}' is not an owner file of pipefisher (it names the run that writes "
                "there; remove it)", file.string());
  const fs::path dir = j["out_dir"].get<std::string>();
  return CheckpointOwner{(dir.is_absolute() ? dir : fs::absolute(ck, ec) / dir).lexically_normal().string(),
                         j["run"].get<std::string>()};
}

// The checkpoint directory of another run directory is refused (preflight.hpp), except by a
// run resuming from it whose owner is gone: the same run, moved.
void check_checkpoint_owner(const Config& cfg, const RunOutputs& o) {
  const std::string ck = checkpoint_dir_of(cfg);
  const std::optional<CheckpointOwner> owner = read_owner(ck);
  if (!owner || same_dir(owner->out_dir, cfg.train.out_dir)) return;
  std::error_code ec;
  const bool gone = !fs::exists(owner->out_dir, ec);
  if (gone && !o.resume_dir.empty() && same_dir(o.resume_dir, ck)) return;
  usage_error("train.checkpoint_dir", "'{}' holds the checkpoints of the run in '{}'{} ({}), not of this run "
              "(train.out_dir '{}'): give this run its own train.checkpoint_dir{}", ck, owner->out_dir,
              gone ? ", which is no longer there" : "", (fs::path(ck) / kOwnerName).string(), cfg.train.out_dir,
              gone ? ", or --resume from it to continue that run here" : "");
}

// owner.json's out_dir: relative to the checkpoint directory inside the run directory (it moves
// with it), else absolute.
std::string owner_out_dir(const std::string& ck, const std::string& out) {
  const fs::path rel = fs::path(normal(out)).lexically_relative(normal(ck));
  const bool inside = !rel.empty() && std::all_of(rel.begin(), rel.end(), [](const fs::path& p) { return p == ".."; });
  return inside ? rel.string() : normal(out);
}

std::string new_run_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

bool continues_its_run(const Config& cfg) {
  const std::string theirs = previous_config(cfg);
  return !theirs.empty() && config_difference(theirs, cfg.to_toml(), kContinuingKeys).empty() &&
         has_checkpoint(checkpoint_dir_of(cfg));
}

void check_output_paths(const Config& cfg, const RunOutputs& o) {
  const std::string& out = cfg.train.out_dir;
  check_dir(out, "train.out_dir");
  std::vector<NamedPath> outputs;
  for (const std::string& name : out_dir_files()) {
    const std::string path = (fs::path(out) / name).string();
    check_output({path, "train.out_dir"});
    outputs.push_back({path, "train.out_dir's " + name});
  }
  const OutputFile save{o.save, "--save", true};
  const OutputFile log{cfg.train.log_json, o.log_json_from_flag ? "--log-json" : "train.log_json", true};
  check_file(log, out);
  check_file(save, out);
  outputs.push_back({save.path, save.what});
  outputs.push_back({log.path, log.what});
  if (checkpoints_on(cfg))
    for (const char* name : {"latest", kOwnerName})
      outputs.push_back({(fs::path(checkpoint_dir_of(cfg)) / name).string(), fmt::format("train.checkpoint_dir's {}", name)});
  if (!o.profile_dir.empty())
    for (const char* name : {"profile.json", "trace.json"})
      outputs.push_back({(fs::path(o.profile_dir) / name).string(), "--profile-dir"});
  const std::vector<NamedPath> inputs = run_inputs(cfg, o);
  refuse_shared_files(outputs, inputs);
  if (checkpoints_on(cfg)) check_checkpoint_dir(cfg);
  check_dir(o.profile_dir, "--profile-dir");
  if (!o.profile_dir.empty())
    for (const char* name : {"profile.json", "trace.json"})
      check_output({(fs::path(o.profile_dir) / name).string(), "--profile-dir"});
  // A live run's outputs are "in use"; a finished one's are another run's unless the same job
  // runs again; a folder that is no run directory is somebody else's.
  check_not_locked(out, "train.out_dir");
  if (!o.overwrite) check_is_run_dir(cfg, inputs);
  if (!o.resuming && !o.overwrite) check_not_another_run(cfg, o.continuing);
  check_not_locked(checkpoint_dir_of(cfg), "train.checkpoint_dir");
  if (checkpoints_on(cfg)) check_checkpoint_owner(cfg, o);
}

RunLocks::~RunLocks() {
  for (int fd : fds_) ::close(fd);
}

std::unique_ptr<RunLocks> lock_output_dirs(const Config& cfg, const RunOutputs& o) {
  auto locks = std::make_unique<RunLocks>();
  locks->add(take_lock(cfg.train.out_dir, "train.out_dir"));
  remove_stale_temporaries(cfg.train.out_dir, out_dir_files());  // a killed write's leftovers
  // The checkpoint directory too, default or not: another run may name this one's
  // out_dir/checkpoints as its train.checkpoint_dir. None without checkpoints.
  if (!checkpoints_on(cfg)) return locks;
  const std::string ck = checkpoint_dir_of(cfg);
  make_dirs(ck, "train.checkpoint_dir");
  std::error_code ec;
  if (!fs::equivalent(ck, cfg.train.out_dir, ec)) locks->add(take_lock(ck, "train.checkpoint_dir"));
  remove_stale_temporaries(ck, {"latest"});
  return locks;
}

std::string claim_checkpoint_dir(const Config& cfg) {
  if (!checkpoints_on(cfg)) return "";
  const std::string ck = checkpoint_dir_of(cfg);
  const std::optional<CheckpointOwner> owner = read_owner(ck);
  const std::string recorded = owner_out_dir(ck, cfg.train.out_dir);
  const std::string run = owner ? owner->run : new_run_id();
  // Rewritten when new, or when a moved run took it over (check_checkpoint_owner).
  if (!owner || !same_dir(owner->out_dir, cfg.train.out_dir))
    write_output({(fs::path(ck) / kOwnerName).string(), "train.checkpoint_dir"},
                 nlohmann::ordered_json{{"out_dir", recorded}, {"run", run}}.dump(1) + "\n");
  return run;
}

void remove_previous_outputs(const Config& cfg) {
  const fs::path out = cfg.train.out_dir;
  std::error_code ec;
  for (const char* name : kRunFiles) {
    // An input of this run (precond.plan_profile = out_dir/kfac_profile.json of the previous one) stays.
    bool input = false;
    for (const std::string& in : {cfg.kfac.plan_profile, cfg.data.train_file, cfg.data.valid_file})
      input |= !in.empty() && fs::equivalent(out / name, in, ec);
    if (!input) fs::remove(out / name, ec);
  }
  // The default checkpoint directory's checkpoints: a later --resume could otherwise continue them.
  const fs::path ck = out / "checkpoints";
  for (const auto& e : fs::directory_iterator(ck, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && e.is_directory(ec) && !e.is_symlink(ec)) remove_checkpoint(e.path().string());
  }
  fs::remove(ck / "latest", ec);
}

}  // namespace pf
