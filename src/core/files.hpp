#pragma once
// Files are written to a temporary name in the same directory, flushed, then renamed, so a reader
// (or a crash) never sees half a file.
#include <string>
#include <string_view>

namespace pf {

void write_file_atomic(const std::string& path, std::string_view content);
// Creates a directory and its parents; UsageError naming `what` if it cannot.
void make_dirs(const std::string& path, const std::string& what);

}  // namespace pf
