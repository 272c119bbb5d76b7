#pragma once
// Hugging Face's safetensors format, exactly:
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data buffer]
// The header maps each tensor name to {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}
// (offsets relative to the start of the data buffer), plus an optional "__metadata__" object of
// string -> string. Tensors tile the data buffer contiguously, without gaps or overlaps. Our writer
// pads the header with spaces to a multiple of 8 bytes, as the reference writer does, so that the
// data buffer starts 8-byte aligned.
//
// Parameter names and layouts are Hugging Face's (Param::name), so a saved model loads in
// transformers; GPT-2's Conv1D weights are stored transposed ([in, out]), see Param::hf_transposed.
#include "core/files.hpp"
#include "core/tensor.hpp"
#include "nn/param.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pf {

using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor of a file: its raw bytes are a view into the reader's mapping of the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;               // "F32", "F16", "BF16", "I64", ... (the format's names)
  Shape shape;
  uint64_t begin = 0, end = 0;     // data_offsets, relative to the data buffer
  std::span<const std::byte> bytes;
};

// Bytes per element of a dtype named by the format; 0 for a name the format does not define.
size_t safetensors_dtype_size(std::string_view dtype);

// A validated, memory-mapped safetensors file. Opening checks everything before any tensor is
// touched: header length within the file, JSON syntax, no duplicate names, known dtypes, offsets
// consistent with shape x dtype size, tensors tiling the data buffer exactly. Every failure is a
// UsageError naming the file (and the tensor, where there is one).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // In data-buffer order.
  const std::vector<SafetensorsEntry>& tensors() const { return entries_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;  // nullptr if absent

  // Converts a floating-point tensor (F32, F16, BF16, F64) to fp32 into `out`, which must hold
  // exactly its element count. Other dtypes are refused with a UsageError.
  void read_f32(const SafetensorsEntry& e, std::span<float> out) const;
  // UsageError naming the file, the tensor and the first element that is NaN or Inf as fp32 (an
  // F64 beyond float's range included); nothing for a tensor that is not floating point.
  void require_finite(const SafetensorsEntry& e) const;

 private:
  void parse();
  std::string path_;
  const std::byte* map_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  SafetensorsMetadata metadata_;
};

// A tensor to write as F32. `data` is row-major with `shape`; with `transpose` (rank 2 only) it is
// row-major with the transposed shape [shape[1], shape[0]] and gets transposed on the way out.
struct SafetensorsTensor {
  std::string name;
  Shape shape;
  std::span<const float> data;
  bool transpose = false;
};

// Writes tensors in the given order through an OutputWriter (core/files.hpp: a temporary renamed
// over the path; a device or link the user named written in place).
void write_safetensors(const OutputFile& out, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});

// A parameter as a file tensor: its Hugging Face name and layout (hf_transposed weights as their
// transpose, [in, out]), which load_safetensors reads back.
SafetensorsTensor param_tensor(const Param& p);

// Saves parameter values under their Hugging Face names; hf_transposed weights are written as
// their transpose ([in, out]); mirrors are skipped (their owner is saved). The metadata gets
// "format": "pt" unless it has a "format", as transformers' loader requires one.
void save_safetensors(const OutputFile& out, const std::vector<const Param*>& params,
                      const SafetensorsMetadata& metadata = {});
void save_safetensors(const std::string& path, const std::vector<const Param*>& params,
                      const SafetensorsMetadata& metadata = {});

struct SafetensorsLoadOptions {
  bool require_all = true;    // every Param must be in the file (else only those present load)
  bool allow_unused = true;   // tensors of the file that match no Param are ignored (else refused)
  bool require_finite = true; // a NaN or Inf is refused (weights); false: the format's values as they are
};

struct SafetensorsLoadResult {
  std::vector<std::string> loaded;   // Param names filled
  std::vector<std::string> missing;  // Param names absent from the file (only without require_all)
  std::vector<std::string> unused;   // file tensors matched by no Param
};

// Loads Param values by name (or the hub's other names for it, io/hf_model.hpp's
// hf_name_candidates): the file's shape must equal the Param's (transposed for hf_transposed), its
// dtype F32/F16/BF16/F64 (converted to fp32), every value finite (require_finite). Mirrors load like
// their owner.
// Nothing is modified unless every check passes.
SafetensorsLoadResult load_safetensors(const std::string& path, const std::vector<Param*>& params,
                                       const SafetensorsLoadOptions& options = {});
// The same from a file already open (a checkpoint's: its files may be rotated away by name).
SafetensorsLoadResult load_safetensors(const SafetensorsReader& file, const std::vector<Param*>& params,
                                       const SafetensorsLoadOptions& options = {});

}  // namespace pf
