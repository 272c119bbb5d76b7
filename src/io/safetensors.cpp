#include "io/safetensors.hpp"

#include "io/hf_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pf {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length field
// must not make us parse gigabytes as JSON).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  const char* name;
  size_t size;
};
// Every dtype the format defines (safetensors' Dtype enum).
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0 && mant == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: mant * 2^-24, renormalised
    uint32_t shifts = 0;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      ++shifts;
    }
    bits = sign | ((127 - 14 - shifts) << 23) | ((mant & 0x3ffu) << 13);
  } else if (exp == 31) {  // inf / nan
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// Raw element of type T at index i of an unaligned byte span.
template <typename T>
T load_at(const std::byte* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

Shape transposed(const Shape& s) { return s.size() == 2 ? Shape{s[1], s[0]} : s; }

// Elements [i0, i0 + n) of a floating-point tensor (F32, F16, BF16, F64) as fp32; false for another dtype.
bool to_f32(const SafetensorsEntry& e, size_t i0, size_t n, float* out) {
  const std::byte* p = e.bytes.data();
  if (e.dtype == "F32") {
    if (n) std::memcpy(out, p + i0 * sizeof(float), n * sizeof(float));
  } else if (e.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_at<uint16_t>(p, i0 + i));
  } else if (e.dtype == "BF16") {
    for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{load_at<uint16_t>(p, i0 + i)} << 16);
  } else if (e.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_at<double>(p, i0 + i));
  } else {
    return false;
  }
  return true;
}

}  // namespace

size_t safetensors_dtype_size(std::string_view dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.size;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) usage_error(path, "cannot open: {}", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    usage_error(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      usage_error(path, "cannot map: {}", std::strerror(err));
    }
    map_ = static_cast<const std::byte*>(m);
  }
  ::close(fd);
  try {
    parse();
  } catch (...) {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept { *this = std::move(o); }

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    entries_ = std::move(o.entries_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

namespace {

using nlohmann::json;

// The header's JSON. nlohmann keeps the last of duplicate keys silently; track the keys of every
// open object to refuse duplicates instead.
json parse_header(const std::string& f, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
    if (ev == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    if (ev == json::parse_event_t::key && !open_objects.empty() && duplicate.empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    usage_error(f, "header is not valid JSON: {}", e.what());
  }
  if (!duplicate.empty()) usage_error(f, "duplicate name '{}' in the header", duplicate);
  if (!header.is_object()) usage_error(f, "header is not a JSON object");
  return header;
}

// One tensor's header entry, its offsets checked against its shape and dtype (not yet against the
// data buffer). file_size bounds the element count.
SafetensorsEntry parse_entry(const std::string& f, const std::string& tensor, const json& info, uint64_t file_size) {
  auto bad = [&](const char* what) { usage_error(f, "tensor '{}': {}", tensor, what); };
  if (!info.is_object()) bad("entry is not an object");
  if (!info.contains("dtype") || !info["dtype"].is_string()) bad("missing or non-string \"dtype\"");
  if (!info.contains("shape") || !info["shape"].is_array()) bad("missing or non-array \"shape\"");
  if (!info.contains("data_offsets") || !info["data_offsets"].is_array() || info["data_offsets"].size() != 2 ||
      !info["data_offsets"][0].is_number_unsigned() || !info["data_offsets"][1].is_number_unsigned())
    bad("\"data_offsets\" is not a pair of non-negative integers");
  SafetensorsEntry e;
  e.name = tensor;
  e.dtype = info["dtype"].get<std::string>();
  size_t elem = safetensors_dtype_size(e.dtype);
  if (elem == 0) usage_error(f, "tensor '{}': unknown dtype '{}'", tensor, e.dtype);
  // Element count with overflow refused: anything above the file size is inconsistent anyway.
  uint64_t numel = 1;
  for (const json& d : info["shape"]) {
    if (!d.is_number_unsigned()) bad("shape has a non-integer or negative dimension");
    uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && numel > file_size / dim) numel = file_size + 1;  // saturate: cannot fit the file
    else numel *= dim;
    e.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dim, INT64_MAX)));
  }
  e.begin = info["data_offsets"][0].get<uint64_t>();
  e.end = info["data_offsets"][1].get<uint64_t>();
  if (e.begin > e.end) usage_error(f, "tensor '{}': data_offsets [{}, {}] are reversed", tensor, e.begin, e.end);
  if (numel > file_size || e.end - e.begin != numel * elem)
    usage_error(f, "tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}", tensor, e.begin,
                e.end, e.end - e.begin, shape_str(e.shape), e.dtype,
                numel > file_size ? std::string("more than the file") : std::to_string(numel * elem));
  return e;
}

// Tensors (sorted by offset) must tile [0, data_size) exactly, as the reference validates.
void check_tiling(const std::string& f, const std::vector<SafetensorsEntry>& entries, uint64_t data_size) {
  for (const auto& e : entries)
    if (e.end > data_size)
      usage_error(f, "tensor '{}': data_offsets [{}, {}] overrun the data buffer of {} bytes (truncated file?)",
                  e.name, e.begin, e.end, data_size);
  uint64_t expected = 0;
  for (const auto& e : entries) {
    if (e.begin < expected)
      usage_error(f, "tensor '{}': data_offsets [{}, {}] overlap the previous tensor, which ends at {}", e.name,
                  e.begin, e.end, expected);
    if (e.begin > expected)
      usage_error(f, "tensor '{}': data_offsets [{}, {}] leave a gap after byte {}", e.name, e.begin, e.end,
                  expected);
    expected = e.end;
  }
  if (expected != data_size)
    usage_error(f, "data buffer has {} bytes but the tensors cover {}", data_size, expected);
}

}  // namespace

void SafetensorsReader::parse() {
  const std::string& f = path_;
  if (size_ < 8) usage_error(f, "file is {} bytes, too short for the 8-byte header length", size_);
  uint64_t n = load_at<uint64_t>(map_, 0);
  if (n > size_ - 8)
    usage_error(f, "header length {} exceeds the {} bytes after the length field (truncated or not safetensors)",
                n, size_ - 8);
  if (n > kMaxHeaderBytes) usage_error(f, "header length {} exceeds the format's limit of {}", n, kMaxHeaderBytes);
  const uint64_t data_size = size_ - 8 - n;
  const std::byte* data = map_ + 8 + n;
  const json header = parse_header(f, std::string_view(reinterpret_cast<const char*>(map_ + 8), n));
  for (auto& [name, info] : header.items()) {
    if (name != "__metadata__") {
      entries_.push_back(parse_entry(f, name, info, size_));
      continue;
    }
    if (!info.is_object()) usage_error(f, "__metadata__ is not an object");
    for (auto& [k, v] : info.items()) {
      if (!v.is_string()) usage_error(f, "__metadata__ value of '{}' is not a string", k);
      metadata_[k] = v.get<std::string>();
    }
  }
  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_tiling(f, entries_, data_size);
  for (size_t i = 0; i < entries_.size(); ++i) {
    auto& e = entries_[i];
    e.bytes = {data + e.begin, static_cast<size_t>(e.end - e.begin)};
    index_.emplace(e.name, i);
  }
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsReader::read_f32(const SafetensorsEntry& e, std::span<float> out) const {
  size_t n = e.bytes.size() / safetensors_dtype_size(e.dtype);
  PF_CHECK(out.size() == n, "tensor '{}' has {} elements, destination {}", e.name, n, out.size());
  if (!to_f32(e, 0, n, out.data()))
    usage_error(path_, "tensor '{}': dtype {} cannot be loaded as floating point (F32, F16, BF16, F64)", e.name,
                e.dtype);
}

void SafetensorsReader::require_finite(const SafetensorsEntry& e) const {
  const size_t n = e.bytes.size() / safetensors_dtype_size(e.dtype);
  float buf[4096];
  for (size_t i0 = 0; i0 < n; i0 += std::size(buf)) {
    const size_t k = std::min(std::size(buf), n - i0);
    if (!to_f32(e, i0, k, buf)) return;  // not floating point: read_f32 refuses it
    for (size_t i = 0; i < k; ++i)
      if (!std::isfinite(buf[i]))
        usage_error(path_, "tensor '{}' holds a non-finite value ({} at index {}): weights and training state must be "
                    "finite", e.name, buf[i], i0 + i);
  }
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

void write_safetensors(const OutputFile& out, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  // Header in data order, __metadata__ first, compact, as the reference writer emits it.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    PF_CHECK(t.name != "__metadata__" && names.insert(t.name).second, "tensor name '{}' reserved or repeated",
             t.name);
    PF_CHECK(static_cast<size_t>(shape_numel(t.shape)) == t.data.size(), "tensor '{}': shape {} vs {} values",
             t.name, shape_str(t.shape), t.data.size());
    PF_CHECK(!t.transpose || t.shape.size() == 2, "tensor '{}': only rank-2 tensors transpose", t.name);
    uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  OutputWriter w(out);
  const uint64_t n = text.size();
  w.write(&n, sizeof n);
  w.write(text);
  std::vector<float> buf;
  for (const auto& t : tensors) {
    if (!t.transpose) {
      w.write(t.data.data(), t.data.size_bytes());
      continue;
    }
    // data is [c, r] row-major; the file wants [r, c] = its transpose.
    const int64_t r = t.shape[0], c = t.shape[1];
    buf.resize(t.data.size());
    for (int64_t j = 0; j < c; ++j)
      for (int64_t i = 0; i < r; ++i) buf[i * c + j] = t.data[j * r + i];
    w.write(buf.data(), buf.size() * sizeof(float));
  }
  w.commit();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  write_safetensors(OutputFile{path}, tensors, metadata);
}

SafetensorsTensor param_tensor(const Param& p) {
  PF_CHECK(!p.hf_transposed || p.value.rank() == 2, "'{}' is hf_transposed but of rank {}", p.name, p.value.rank());
  return {p.name, p.hf_transposed ? transposed(p.value.shape()) : p.value.shape(), p.value.span(), p.hf_transposed};
}

void save_safetensors(const OutputFile& out, const std::vector<const Param*>& params,
                      const SafetensorsMetadata& metadata) {
  std::vector<SafetensorsTensor> tensors;
  for (const Param* p : params)
    if (!p->mirror) tensors.push_back(param_tensor(*p));
  // transformers' loader refuses a file whose metadata lacks a known "format"; ours are PyTorch's.
  SafetensorsMetadata meta = metadata;
  meta.emplace("format", "pt");
  write_safetensors(out, tensors, meta);
}

void save_safetensors(const std::string& path, const std::vector<const Param*>& params,
                      const SafetensorsMetadata& metadata) {
  save_safetensors(OutputFile{path}, params, metadata);
}

// ---------------------------------------------------------------------------------------------
// Loading parameters
// ---------------------------------------------------------------------------------------------

SafetensorsLoadResult load_safetensors(const std::string& path, const std::vector<Param*>& params,
                                       const SafetensorsLoadOptions& options) {
  return load_safetensors(SafetensorsReader(path), params, options);
}

SafetensorsLoadResult load_safetensors(const SafetensorsReader& file, const std::vector<Param*>& params,
                                       const SafetensorsLoadOptions& options) {
  const std::string& path = file.path();
  SafetensorsLoadResult result;
  // Check everything first, so that a refused file leaves every Param untouched.
  std::vector<std::pair<Param*, const SafetensorsEntry*>> plan;
  std::set<std::string, std::less<>> matched;
  for (Param* p : params) {
    PF_CHECK(!p->hf_transposed || p->value.rank() == 2, "'{}' is hf_transposed but of rank {}", p->name,
             p->value.rank());
    Shape want = p->hf_transposed ? transposed(p->value.shape()) : p->value.shape();
    const SafetensorsEntry* e = nullptr;
    for (const std::string& name : hf_name_candidates(p->name))
      if ((e = file.find(name))) break;
    if (!e) {
      if (options.require_all) usage_error(path, "tensor '{}' (shape {}) is missing", p->name, shape_str(want));
      result.missing.push_back(p->name);
      continue;
    }
    if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16" && e->dtype != "F64")
      usage_error(path, "tensor '{}': dtype {} is not floating point (F32, F16, BF16, F64)", e->name, e->dtype);
    if (e->shape != want)
      usage_error(path, "tensor '{}': shape {} in the file, the model expects {}{}", e->name, shape_str(e->shape),
                  shape_str(want), p->hf_transposed ? " (Conv1D layout [in, out])" : "");
    if (options.require_finite) file.require_finite(*e);
    plan.emplace_back(p, e);
    matched.insert(e->name);
  }
  for (const auto& e : file.tensors()) {
    if (matched.count(e.name)) continue;
    if (!options.allow_unused) usage_error(path, "tensor '{}' matches no parameter of the model", e.name);
    result.unused.push_back(e.name);
  }

  std::vector<float> buf;
  for (auto [p, e] : plan) {
    if (!p->hf_transposed) {
      file.read_f32(*e, p->value.span());
    } else {
      // The file holds [c, r] for our [r, c].
      const int64_t r = p->value.dim(0), c = p->value.dim(1);
      buf.resize(static_cast<size_t>(r * c));
      file.read_f32(*e, buf);
      float* v = p->value.data();
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) v[i * c + j] = buf[j * r + i];
    }
    result.loaded.push_back(p->name);
  }
  return result;
}

}  // namespace pf
