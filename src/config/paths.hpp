#pragma once
// Paths that do not depend on the current directory. A config file's relative paths resolve
// against the file's directory, the command line's against the current one (config.cpp), and
// every path a run holds is absolute, so its config.toml works from anywhere. Data no path names
// (the default token files, the vocabulary) is looked for where the project keeps it.
#include <string>
#include <vector>

namespace pf {

// `path` made absolute against `base` (a directory; empty: the current directory) and lexically
// normal ("configs/../runs/x" -> "runs/x"); an absolute path and "" come back unchanged.
std::string absolute_path(const std::string& path, const std::string& base = "");

// Where the project's prepared data may hold `rel` ("corpus/train.bert.bin", "vocab"), in order:
// the current directory's data/, then the data/ of the tree the program was built in (beside its
// build directory: build/pipefisher -> data/). Absolute paths, without repeats.
std::vector<std::string> data_candidates(const std::string& rel);
// The first of data_candidates(rel) that exists, else the first (for the error naming it).
std::string find_data(const std::string& rel);

}  // namespace pf
