#include "io/checkpoint.hpp"

#include "core/error.hpp"
#include "core/files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

namespace pf {

namespace fs = std::filesystem;

// --- SHA-256 (FIPS 180-4) ---
namespace {

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

class Sha256 {
 public:
  void update(const unsigned char* p, size_t n) {
    total_ += n;
    while (n > 0) {
      const size_t take = std::min(n, size_t{64} - fill_);
      std::memcpy(buf_.data() + fill_, p, take);
      fill_ += take, p += take, n -= take;
      if (fill_ == 64) block(buf_.data()), fill_ = 0;
    }
  }
  std::string hex() {
    const uint64_t bits = total_ * 8;
    const unsigned char pad = 0x80, zero = 0;
    update(&pad, 1);
    while (fill_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    for (uint32_t v : h_) out += fmt::format("{:08x}", v);
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const unsigned char* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> buf_{};
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

constexpr const char* kFormat = "pipefisher-checkpoint";
constexpr int kVersion = 1;
constexpr size_t kMaxManifestBytes = 16 << 20;  // a manifest lists a few files: anything bigger is not one

bool plain_file_name(const std::string& n) {
  return !n.empty() && n.size() <= 255 && n != "." && n != ".." && n.find('/') == std::string::npos &&
         n.find('\\') == std::string::npos && n.find('\0') == std::string::npos;
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Step number of a "step-NNNNNN" directory name, -1 for anything else.
int64_t step_of(const std::string& name) {
  if (name.size() < 6 || name.size() > 24 || name.rfind("step-", 0) != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string read_small_file(const std::string& path, size_t limit) {
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(path, "cannot read");
  std::string s;
  s.resize(limit + 1);
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(f.gcount()));
  if (s.size() > limit) usage_error(path, "larger than {} bytes: not a checkpoint file", limit);
  return s;
}

}  // namespace

std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(reinterpret_cast<const unsigned char*>(data.data()), data.size());
  return h.hex();
}

std::string sha256_hex(std::string_view data) { return sha256_hex(std::as_bytes(std::span(data.data(), data.size()))); }

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) usage_error(path, "cannot read: {}", std::strerror(errno));
  Sha256 h;
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) usage_error(path, "read error");
  return h.hex();
}

std::string checkpoint_step_dir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step-{:06d}", step)).string();
}

CheckpointFile write_checkpoint_tensors(const std::string& step_dir, const std::string& name,
                                        const std::vector<SafetensorsTensor>& tensors,
                                        const SafetensorsMetadata& metadata) {
  PF_CHECK(plain_file_name(name), "checkpoint file name '{}'", name);
  const std::string path = (fs::path(step_dir) / name).string();
  write_safetensors(path, tensors, metadata);
  return {name, static_cast<uint64_t>(fs::file_size(path)), sha256_file(path)};
}

void remove_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  // A link (an archived copy placed here) goes itself: what it names is not this run's to delete.
  if (fs::is_symlink(fs::symlink_status(step_dir, ec))) {
    fs::remove(step_dir, ec);
    return;
  }
  fs::remove(fs::path(step_dir) / "manifest.json", ec);
  fs::remove_all(step_dir, ec);
}

namespace {

// The manifest at `file` carries the run of `m` (info "run"; both without one: the same).
bool same_run(const fs::path& file, const CheckpointManifest& m) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec) || fs::file_size(file, ec) > kMaxManifestBytes) return false;
  std::ifstream f(file);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    const CheckpointManifest other = parse_checkpoint_manifest(text, file.string());
    const auto run = [](const CheckpointManifest& x) {
      const auto it = x.info.find("run");
      return it == x.info.end() ? std::string() : it->second;
    };
    return run(other) == run(m);
  } catch (const UsageError&) {
    return false;  // not a manifest of ours: not this run's to remove
  }
}

}  // namespace

void commit_checkpoint(const std::string& dir, const CheckpointManifest& m, int keep) {
  const std::string step_dir = checkpoint_step_dir(dir, m.step);
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = m.step;
  j["info"] = m.info;
  j["files"] = nlohmann::json::array();
  for (const CheckpointFile& f : m.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  write_file_atomic(step_dir + "/manifest.json", j.dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "latest").string(), fs::path(step_dir).filename().string() + "\n");

  // Retention: the newest `keep` complete checkpoints of this run stay (this one among them; 0 = all
  // of them); its older ones go. Anything else (another run's checkpoint, a directory without a
  // manifest, newer directories) is left alone: only what this run wrote is removed.
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && s <= m.step && e.is_directory() && same_run(e.path() / "manifest.json", m)) steps.emplace_back(s, e.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = 0; keep > 0 && i < steps.size(); ++i)
    if (i >= static_cast<size_t>(keep)) remove_checkpoint(steps[i].second.string());
}

CheckpointManifest parse_checkpoint_manifest(std::string_view text, const std::string& what) {
  if (text.size() > kMaxManifestBytes) usage_error(what, "larger than {} bytes", kMaxManifestBytes);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) usage_error(what, "not valid JSON");
  if (!j.is_object()) usage_error(what, "not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) usage_error(what, "not a pipefisher checkpoint manifest (\"format\")");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != kVersion)
    usage_error(what, "unsupported \"version\" (expected {})", kVersion);
  CheckpointManifest m;
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0)
    usage_error(what, "\"step\" must be a non-negative integer");
  m.step = j["step"].get<int64_t>();
  if (j.contains("info")) {
    if (!j["info"].is_object()) usage_error(what, "\"info\" must be an object of strings");
    for (const auto& [k, v] : j["info"].items()) {
      if (!v.is_string()) usage_error(what, "\"info\".\"{}\" must be a string", k);
      m.info[k] = v.get<std::string>();
    }
  }
  if (!j.contains("files") || !j["files"].is_array() || j["files"].empty())
    usage_error(what, "\"files\" must be a non-empty array");
  std::set<std::string> seen;
  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string())
      usage_error(what, "every entry of \"files\" needs \"name\" (string), \"bytes\" (unsigned) and \"sha256\" (string)");
    CheckpointFile cf{f["name"].get<std::string>(), f["bytes"].get<uint64_t>(), f["sha256"].get<std::string>()};
    if (!plain_file_name(cf.name) || cf.name == "manifest.json")
      usage_error(what, "file name '{}' is not a plain file name of the checkpoint", cf.name);
    if (!is_hex64(cf.sha256)) usage_error(what, "file '{}': \"sha256\" is not 64 lowercase hex digits", cf.name);
    if (!seen.insert(cf.name).second) usage_error(what, "file '{}' listed twice", cf.name);
    m.files.push_back(std::move(cf));
  }
  return m;
}

CheckpointManifest read_checkpoint(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  if (!fs::is_regular_file(path)) usage_error(step_dir, "incomplete checkpoint (no manifest.json)");
  CheckpointManifest m = parse_checkpoint_manifest(read_small_file(path, kMaxManifestBytes), path);
  // The directory name is what `latest`, retention and the fallback scan go by.
  const int64_t named = step_of(fs::path(step_dir).lexically_normal().filename().string());
  if (named >= 0 && named != m.step)
    usage_error(path, "says step {} but its directory is step {} (moved or edited checkpoint)", m.step, named);
  for (const CheckpointFile& f : m.files) {
    const std::string p = (fs::path(step_dir) / f.name).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(p, ec);
    if (ec) usage_error(p, "listed in the manifest but missing");
    if (size != f.bytes) usage_error(p, "{} bytes, the manifest says {}", size, f.bytes);
    if (sha256_file(p) != f.sha256) usage_error(p, "checksum does not match the manifest (corrupt file)");
  }
  return m;
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (step_of(e.path().filename().string()) >= 0 && fs::is_regular_file(e.path() / "manifest.json", ec)) return true;
  return false;
}

std::string find_latest_checkpoint(const std::string& dir, const std::string& what, std::string* passed_over) {
  if (!fs::is_directory(dir)) usage_error(what, "no checkpoint directory '{}'", dir);
  // DIR/step-000300 itself: that one checkpoint, verified (read_checkpoint names what is wrong).
  fs::path name = fs::path(dir).lexically_normal();
  if (name.filename().empty()) name = name.parent_path();
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "manifest.json", ec) ||
      (step_of(name.filename().string()) >= 0 && !fs::exists(fs::path(dir) / "latest", ec))) {
    read_checkpoint(dir);
    if (passed_over) passed_over->clear();
    return dir;
  }
  std::vector<std::string> skipped;  // newer candidates that did not verify, newest first
  auto complete = [&](const fs::path& p) {
    try {
      read_checkpoint(p.string());
      return true;
    } catch (const UsageError& e) {
      skipped.push_back(e.what());
      return false;
    }
  };
  auto found = [&](const fs::path& p) {
    if (passed_over) {
      passed_over->clear();
      if (!skipped.empty())
        *passed_over = fmt::format("{} newer checkpoint{} not usable (the newest: {})", skipped.size(),
                                   skipped.size() > 1 ? "s" : "", skipped.front());
    }
    return p.string();
  };
  // `latest` names a directory of dir; anything else in it is ignored (the scan below decides).
  std::string tried;
  if (fs::is_regular_file(fs::path(dir) / "latest", ec)) {
    std::string name;
    try {
      name = read_small_file((fs::path(dir) / "latest").string(), 64);
    } catch (const UsageError&) {
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (step_of(name) >= 0) {
      tried = name;
      const fs::path p = fs::path(dir) / name;
      if (!fs::is_directory(p, ec)) skipped.push_back(fmt::format("{}: named by 'latest' but missing", p.string()));
      else if (complete(p)) return found(p);
    }
  }
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory() && e.path().filename().string() != tried) steps.emplace_back(s, e.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& [s, p] : steps)
    if (complete(p)) return found(p);
  // skipped.front() is a whole message, already bounded: not clipped again as a value.
  throw UsageError(fmt::format("{}: no complete checkpoint in '{}'{}", what, clip_for_message(dir),
                               skipped.empty() ? "" : " (" + skipped.front() + ")"));
}

CheckpointReader::CheckpointReader(const std::string& step_dir) : dir_(step_dir), manifest_(read_checkpoint(step_dir)) {
  for (const CheckpointFile& f : manifest_.files) {
    if (!f.name.ends_with(".safetensors")) continue;
    files_.push_back(std::make_unique<SafetensorsReader>((fs::path(step_dir) / f.name).string()));
    const size_t k = files_.size() - 1;
    for (const SafetensorsEntry& e : files_[k]->tensors())
      if (!index_.emplace(e.name, std::pair{k, &e}).second)
        usage_error(step_dir, "tensor '{}' is in two files of the checkpoint", e.name);
  }
  if (files_.empty()) usage_error(step_dir, "the manifest lists no safetensors file");
}

bool CheckpointReader::has(std::string_view name) const { return index_.find(name) != index_.end(); }

void CheckpointReader::read(std::string_view name, const Shape& shape, std::span<float> out) const {
  auto it = index_.find(name);
  if (it == index_.end()) usage_error(dir_, "checkpoint has no tensor '{}'", name);
  const SafetensorsEntry& e = *it->second.second;
  if (e.shape != shape)
    usage_error(dir_, "tensor '{}' has shape {} in the checkpoint, {} here", name, shape_str(e.shape), shape_str(shape));
  PF_CHECK(out.size() == static_cast<size_t>(shape_numel(shape)), "'{}': output of {} for {} elements", name, out.size(), shape_numel(shape));
  files_[it->second.first]->read_f32(e, out);
}

void CheckpointReader::load_params(const std::vector<Param*>& params) const {
  // Every name first, so that nothing is modified unless all are there.
  std::vector<std::vector<Param*>> by_file(files_.size());
  for (Param* p : params) {
    auto it = index_.find(p->name);
    if (it == index_.end()) usage_error(dir_, "checkpoint has no tensor '{}'", p->name);
    by_file[it->second.first].push_back(p);
  }
  for (size_t k = 0; k < files_.size(); ++k)
    if (!by_file[k].empty()) load_safetensors(*files_[k], by_file[k], {true, true});
}

const SafetensorsMetadata& CheckpointReader::metadata_of(std::string_view name) const {
  if (name.empty()) return files_.front()->metadata();
  auto it = index_.find(name);
  if (it == index_.end()) usage_error(dir_, "checkpoint has no tensor '{}'", name);
  return files_[it->second.first]->metadata();
}

std::string CheckpointReader::state_metadata(const std::string& key) const {
  for (const auto& f : files_)
    if (auto it = f->metadata().find(key); it != f->metadata().end()) return it->second;
  return "";
}

}  // namespace pf
