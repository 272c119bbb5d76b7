#pragma once
// Training checkpoints on disk: a directory per checkpoint, a manifest with checksums, a `latest`
// pointer, and the last K kept.
//
//   DIR/step-000100/weights-stage-0.safetensors   parameter values of stage 0 (Hugging Face names)
//   DIR/step-000100/state-stage-0.safetensors     optimizer moments ("<param>.exp_avg", ...), K-FAC
//                                                 factors, inverses and counters ("<layer>.kfac.A", ...)
//   DIR/step-000100/...                           one pair per stage (pipeline 0 of replica 0)
//   DIR/step-000100/manifest.json                 written last, by rank 0: step, run facts, and the
//                                                 byte count and SHA-256 of every file
//   DIR/latest                                    "step-000100": the newest complete checkpoint
//
// Every file is written under a temporary name, flushed and renamed, and the manifest only after
// all files are complete, so a checkpoint is complete iff its manifest exists and every checksum
// matches; a crash at any moment leaves the previous complete checkpoint intact. Tensors are found
// by name across all files of a checkpoint, so a checkpoint written by one parallel layout loads
// into any other (4 stages into one process and back).
#include "io/safetensors.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pf {

// SHA-256 of bytes / of a file's contents, as 64 lowercase hex digits.
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view data);
std::string sha256_file(const std::string& path);  // UsageError naming the file if unreadable

struct CheckpointFile {
  std::string name;    // plain file name inside the step directory
  uint64_t bytes = 0;
  std::string sha256;
};

struct CheckpointManifest {
  int64_t step = 0;                          // steps completed: a resumed run runs this step next
  std::map<std::string, std::string> info;   // run facts (seeds, data position, optimizer, layout)
  std::vector<CheckpointFile> files;
};

// "DIR/step-000100" (at least six digits).
std::string checkpoint_step_dir(const std::string& dir, int64_t step);

// Writes tensors as a safetensors file into step_dir (temporary name, fsync, rename) and returns
// its name, size and checksum.
CheckpointFile write_checkpoint_tensors(const std::string& step_dir, const std::string& name,
                                        const std::vector<SafetensorsTensor>& tensors,
                                        const SafetensorsMetadata& metadata = {});

// Rank 0, after every file of the step is complete: writes manifest.json (atomically), then points
// DIR/latest at it, then deletes this run's older checkpoints beyond its newest `keep` (0: keeps
// every one). This run's: a step directory whose manifest carries the same info "run" (the id in
// the checkpoint directory's owner.json, train/preflight.hpp). Another run's checkpoints, and
// directories without a manifest, stay: a step directory's own writer removes its leftovers.
void commit_checkpoint(const std::string& dir, const CheckpointManifest& manifest, int keep);

// Deletes a step directory, its manifest first: a directory that still has a manifest is always
// complete, whenever the deletion is cut short. A step directory that is a link: the link alone.
void remove_checkpoint(const std::string& step_dir);

// Parses a manifest's text; `what` names it in errors. Refuses anything malformed (wrong types,
// a file name with a path in it, a bad checksum string, a duplicate file) with a UsageError.
CheckpointManifest parse_checkpoint_manifest(std::string_view text, const std::string& what);
// Reads step_dir/manifest.json and verifies every file it lists (size and SHA-256), and that a
// step-N directory's manifest says step N.
CheckpointManifest read_checkpoint(const std::string& step_dir);

// The step directory of the newest complete checkpoint under dir: the one `latest` names if it
// verifies, else the highest step-* directory that does; dir itself when it is a step directory
// (it holds manifest.json, or is named step-N), verified. UsageError naming `what` if none. When
// newer candidates were passed over (corrupt, incomplete, missing), *passed_over says how many
// and why the newest failed, for the caller to tell the user (empty otherwise).
std::string find_latest_checkpoint(const std::string& dir, const std::string& what = "--resume",
                                   std::string* passed_over = nullptr);

// Whether dir holds a step directory with a manifest (a checkpoint that completed; not verified:
// find_latest_checkpoint does that). False for a missing directory.
bool has_checkpoint(const std::string& dir);

// Every tensor of a verified checkpoint, found by name across its safetensors files.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& step_dir);
  const CheckpointManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

  bool has(std::string_view name) const;
  // The tensor's shape must be `shape` (converted to fp32); UsageError naming it otherwise, or
  // when it is absent.
  void read(std::string_view name, const Shape& shape, std::span<float> out) const;
  // Parameter values by name (safetensors' layout rules: hf_transposed, mirrors load like their
  // owner). Every param must be present.
  void load_params(const std::vector<Param*>& params) const;
  // Metadata of the file holding `name`, or of the first file when name is empty.
  const SafetensorsMetadata& metadata_of(std::string_view name) const;
  // Metadata value `key` of any state file that has it, or "" (e.g. "optimizer_steps").
  std::string state_metadata(const std::string& key) const;
  // Its safetensors files, in the manifest's order.
  const std::vector<std::unique_ptr<SafetensorsReader>>& files() const { return files_; }

 private:
  std::string dir_;
  CheckpointManifest manifest_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::pair<size_t, const SafetensorsEntry*>, std::less<>> index_;
};

}  // namespace pf
