#pragma once
// Every file pipefisher writes goes through here, under one rule:
// - absent or a regular file: written whole to a temporary beside it (NAME.tmp.PID, created
//   exclusively, never through a link), synced, then renamed over it, so a reader (or a crash)
//   never sees half a file; a log or lock is opened where it is, never through a link;
// - a directory: refused;
// - a symbolic link, device, FIFO or socket: refused, unless the user named this very path
//   (`--save /dev/null`, `--log-json /dev/stdout`): then it is opened and written where it is,
//   never renamed over. So a file the program names in a directory (out_dir/log.jsonl) never
//   leads out of it, and a device node is never replaced.
// Refusals are UsageError "<what>: '<path>' is ..." and come before the first byte is written.
#include <string>
#include <string_view>
#include <vector>

namespace pf {

struct OutputFile {
  std::string path;
  std::string what = {};    // the flag or key an error names; empty: the path alone
  bool user_named = false;  // the user named this path itself (a flag), not only its directory
};

enum class OutputMode { replace, in_place };

// The rule above, checked without writing: how `f` is written, or UsageError.
OutputMode check_output(const OutputFile& f);

// One output written whole: into a temporary that commit() renames over the path, or in place.
class OutputWriter {
 public:
  explicit OutputWriter(OutputFile f);  // checks the rule, opens
  ~OutputWriter();                      // not committed: the temporary is removed
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  int fd() const { return fd_; }
  // All of it; UsageError naming the file when it cannot (a full disk).
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();  // synced, renamed into place, the rename made durable

 private:
  [[noreturn]] void fail(const std::string& message);
  OutputFile f_;
  OutputMode mode_;
  std::string tmp_;
  int fd_ = -1;
};

void write_output(const OutputFile& f, std::string_view content);
// A file the program names (errors name its path).
void write_file_atomic(const std::string& path, std::string_view content);

// Opens an output to be written where it is (a log appended to, a lock): `flags` (O_WRONLY |
// O_APPEND, O_RDWR, ...), plus O_CREAT where a regular file goes, which is never opened through a
// link. Returns the descriptor (close-on-exec); UsageError by the rule, or when it cannot open.
int open_output(const OutputFile& f, int flags);

// A path and the flag or key (or description) that names it.
struct NamedPath {
  std::string path;
  std::string what;
};

// Outputs naming one file (the same path, or a link or hard link to an existing one) or an
// output naming an input: UsageError "<output>: '<path>' is also <other>". Devices and FIFOs are
// shared freely (two outputs to /dev/null). Empty paths are skipped.
void refuse_shared_files(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs = {});

// A command's outputs before it writes any: each by the rule, none shared (refuse_shared_files).
void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<NamedPath>& inputs = {});

// Removes dir/NAME.tmp.DIGITS for each NAME of `names` that is a regular file: what a process
// killed while writing NAME left. Only for a directory whose lock the caller holds (nothing of it
// is being written).
void remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names);

// An input named by `what` must be a regular file (followed through links): UsageError "no such
// file" (with `hint`, how one is made) when nothing is there, "is a FIFO, not a regular file" (a
// directory, a device...) when something else is.
void require_input_file(const std::string& path, const std::string& what, const std::string& hint);

// An input read whole: a regular file (followed through links) of at most max_bytes. A device,
// FIFO or directory, or a larger file, is a UsageError naming `what` and the path, before it is
// read: /dev/zero as a profile must not grow until the kernel kills the process.
std::string read_input_file(const std::string& path, const std::string& what, size_t max_bytes);

// Creates a directory and its parents; UsageError naming `what` if it cannot.
void make_dirs(const std::string& path, const std::string& what);

}  // namespace pf
