#include "core/files.hpp"

#include "core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cstdint>
#include <optional>

namespace pf {

namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "directory";
  if (S_ISLNK(m)) return "symbolic link";
  if (S_ISCHR(m)) return "character device";
  if (S_ISBLK(m)) return "block device";
  if (S_ISFIFO(m)) return "FIFO";
  if (S_ISSOCK(m)) return "socket";
  return "special file";
}

// "<what>: '<path>' <message>", or "<path>: <message>" when no flag or key names it.
[[noreturn]] void refuse(const OutputFile& f, const std::string& message) {
  if (f.what.empty()) throw UsageError(f.path + ": " + message);
  throw UsageError(fmt::format("{}: '{}' {}", f.what, f.path, message));
}

[[noreturn]] void refuse_kind(const OutputFile& f, mode_t m) {
  refuse(f, fmt::format("is a {}, not a regular file: outputs are not written through links or over devices "
                        "(remove it{})", kind_of(m), f.user_named ? "" : ", or name another directory"));
}

// A write that failed: "<what>: cannot write '<path>': <detail>", or "<path>: cannot write: <detail>".
[[noreturn]] void io_failure(const OutputFile& f, const std::string& detail) {
  if (f.what.empty()) throw UsageError(fmt::format("{}: cannot write: {}", f.path, detail));
  throw UsageError(fmt::format("{}: cannot write '{}': {}", f.what, f.path, detail));
}

void sync_parent(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// What identifies a file: an existing regular file's device and inode (the same for a link or a
// hard link to it); a new file's absolute path, its existing directories resolved. Nothing for
// devices, FIFOs and directories, which outputs may share.
std::optional<std::string> identity(const std::string& path) {
  if (path.empty()) return std::nullopt;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0)
    return S_ISREG(st.st_mode) ? std::optional(fmt::format("inode {}:{}", st.st_dev, st.st_ino)) : std::nullopt;
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  const fs::path resolved = fs::weakly_canonical(abs, ec);
  return "path " + (ec ? abs.lexically_normal() : resolved).string();
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

OutputMode check_output(const OutputFile& f) {
  struct stat st {};
  // Absent (or unreadable): created; a missing directory is the writer's error.
  if (::lstat(f.path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return OutputMode::replace;
  if (S_ISDIR(st.st_mode)) refuse(f, "is a directory");
  if (!f.user_named) refuse_kind(f, st.st_mode);
  if (S_ISLNK(st.st_mode)) {
    struct stat to {};
    if (::stat(f.path.c_str(), &to) != 0) refuse(f, "is a symbolic link to nothing that can be written");
    if (S_ISDIR(to.st_mode)) refuse(f, "is a directory");
  }
  return OutputMode::in_place;
}

OutputWriter::OutputWriter(OutputFile f) : f_(std::move(f)), mode_(check_output(f_)) {
  if (mode_ == OutputMode::in_place) {
    fd_ = ::open(f_.path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd_ < 0) fail(fmt::format("cannot open: {}", std::strerror(errno)));
    return;
  }
  const std::string tmp = f_.path + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // left by a dead process that had this pid
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
  tmp_ = tmp;
}

OutputWriter::~OutputWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputWriter::fail(const std::string& detail) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  io_failure(f_, detail);
}

void OutputWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void OutputWriter::commit() {
  // A device or a pipe written in place has nothing to sync.
  if (::fsync(fd_) != 0 && (mode_ == OutputMode::replace || (errno != EINVAL && errno != EROFS && errno != ENOTSUP)))
    fail(fmt::format("fsync: {}", std::strerror(errno)));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(fmt::format("close: {}", std::strerror(errno)));
  if (mode_ == OutputMode::in_place) return;
  if (::rename(tmp_.c_str(), f_.path.c_str()) != 0)
    fail(fmt::format("cannot rename '{}' over it: {}", tmp_, std::strerror(errno)));
  tmp_.clear();
  sync_parent(f_.path);  // the rename itself made durable
}

void write_output(const OutputFile& f, std::string_view content) {
  OutputWriter w(f);
  w.write(content);
  w.commit();
}

void write_file_atomic(const std::string& path, std::string_view content) { write_output({path}, content); }

int open_output(const OutputFile& f, int flags) {
  if (check_output(f) == OutputMode::in_place) {
    const int fd = ::open(f.path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) io_failure(f, fmt::format("cannot open: {}", std::strerror(errno)));
    return fd;
  }
  // Never through a link (ELOOP), nor blocking on a FIFO put here since the check.
  const int fd = ::open(f.path.c_str(), flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ELOOP) refuse_kind(f, S_IFLNK);
  if (fd < 0) io_failure(f, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse_kind(f, st.st_mode);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void refuse_shared_files(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  std::vector<std::pair<std::string, const NamedPath*>> in, out;
  for (const NamedPath& p : inputs)
    if (auto id = identity(p.path)) in.emplace_back(*id, &p);
  for (const NamedPath& p : outputs) {
    const auto id = identity(p.path);
    if (!id) continue;
    for (const auto& [other, q] : in)
      if (other == *id) usage_error(p.what, "'{}' is also {}, which is read: write it elsewhere", p.path, q->what);
    for (const auto& [other, q] : out)
      if (other == *id) usage_error(p.what, "'{}' is also {}: give each output a file of its own", p.path, q->what);
    out.emplace_back(*id, &p);
  }
}

void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<NamedPath>& inputs) {
  std::vector<NamedPath> named;
  for (const OutputFile& f : outputs) {
    if (f.path.empty()) continue;
    check_output(f);
    named.push_back({f.path, f.what});
  }
  refuse_shared_files(named, inputs);
}

void remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const auto ours = [&](const std::string& name) {
      const std::string prefix = name + ".tmp.";
      return n.compare(0, prefix.size(), prefix) == 0 && all_digits(std::string_view(n).substr(prefix.size()));
    };
    std::error_code e;
    if (std::any_of(names.begin(), names.end(), ours) && it->symlink_status(e).type() == fs::file_type::regular)
      fs::remove(it->path(), e);
  }
}

void require_input_file(const std::string& path, const std::string& what, const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) usage_error(what, "no such file '{}' ({})", path, hint);
    usage_error(what, "cannot open '{}': {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) usage_error(what, "'{}' is a {}, not a regular file", path, kind_of(st.st_mode));
}

std::string read_input_file(const std::string& path, const std::string& what, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) usage_error(what, "cannot open '{}': no such file", path);
    usage_error(what, "cannot open '{}': {}", path, std::strerror(e));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    usage_error(what, "'{}' is a {}, not a regular file", path, kind_of(st.st_mode));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    usage_error(what, "'{}' is {} bytes, over the bound of {} bytes for this input", path, st.st_size, max_bytes);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      usage_error(what, "cannot read '{}': {}", path, std::strerror(e));
    }
    if (n == 0) break;  // shrank while read: what is there
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

void make_dirs(const std::string& path, const std::string& what) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) usage_error(what, "cannot create directory '{}': {}", path, ec.message());
}

}  // namespace pf
