#pragma once
// "Did you mean ...?": the candidate closest to a misspelt word, for error messages about
// configuration keys and command-line flags.
#include <algorithm>
#include <string>
#include <vector>

namespace pf {

// Levenshtein distance: the number of one-character insertions, deletions and substitutions
// from a to b ("layerz" -> "layers": 1).
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate within typo distance of `word` (about a third of its characters, at most 3,
// edited), the nearest first; "" when none is that close.
template <typename Range>
std::string closest_match(const std::string& word, const Range& candidates) {
  std::string best;
  size_t best_d = std::min<size_t>(3, (word.size() + 2) / 3) + 1;
  for (const std::string& c : candidates)
    if (const size_t d = edit_distance(word, c); d < best_d) best_d = d, best = c;
  return best;
}

}  // namespace pf
