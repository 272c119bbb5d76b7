#include "runtime/config_agreement.hpp"

#include "comm/collectives.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace pf {
namespace {

// (key, value) in the text's order: "[table]" prefixes the keys after it; a line that is not
// "key = value" continues the previous value (a long array printed over several lines).
std::vector<std::pair<std::string, std::string>> key_values(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string table;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const size_t eq = line.find(" = ");
    if (line.front() == '[' && line.back() == ']' && eq == std::string::npos) {
      table = line.substr(1, line.size() - 2) + ".";
    } else if (eq != std::string::npos && line.front() != ' ') {
      out.emplace_back(table + line.substr(0, eq), line.substr(eq + 3));
    } else if (!out.empty()) {
      out.back().second += " " + line;
    }
  }
  return out;
}

// A value as a message shows it: whole unless long.
std::string shown(const std::string& v) { return v.size() <= 80 ? v : v.substr(0, 77) + "..."; }

}  // namespace

std::string canonical_run_text(const Config& cfg, const TrainRunArgs& args) {
  const auto quoted = [](const std::string& s) { return fmt::format("'{}'", s); };
  return fmt::format("--init = {}\n--save = {}\n--resume = {}\n--profile-dir = {}\n--overwrite = {}\n{}",
                     quoted(args.init), quoted(args.save), quoted(args.resume), quoted(args.profile_dir),
                     args.overwrite, cfg.to_toml());
}

KeyDifference first_difference(const std::string& a, const std::string& b) {
  const auto in_a = key_values(a), in_b = key_values(b);
  const std::map<std::string, std::string> map_a(in_a.begin(), in_a.end()), map_b(in_b.begin(), in_b.end());
  for (const auto& [key, value] : in_a) {
    const auto it = map_b.find(key);
    if (it == map_b.end()) return {key, value, "(absent)"};
    if (it->second != value) return {key, value, it->second};
  }
  for (const auto& [key, value] : in_b)
    if (!map_a.count(key)) return {key, "(absent)", value};
  return {};
}

void require_one_configuration(const Config& cfg, const TrainRunArgs& args, int world_rank) {
  const std::string text = canonical_run_text(cfg, args);
  const uint64_t mine = stream_key(0, text);
  uint64_t root = mine;
  comm::broadcast_bytes(&root, sizeof root, 0, MPI_COMM_WORLD);
  // Only ranks that differ from rank 0 send their text.
  const std::vector<std::string> texts = comm::gather_bytes(mine == root ? std::string() : text, 0, MPI_COMM_WORLD);
  comm::on_root_agreed(world_rank, [&] {
    std::vector<int> ranks;
    for (size_t r = 0; r < texts.size(); ++r)
      if (!texts[r].empty()) ranks.push_back(static_cast<int>(r));
    if (ranks.empty()) return;
    KeyDifference d = first_difference(text, texts[ranks.front()]);
    if (d.key.empty()) d = {"configuration", "its text", "a text with the same keys and values"};  // not from to_toml
    usage_error(d.key, "{} on rank 0 but {} on rank {}: every rank must run one configuration (rank{} {} differ{} "
                "from rank 0; with mpirun's MPMD syntax, give every program the same --config, --set and flags)",
                shown(d.a), shown(d.b), ranks.front(), ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "),
                ranks.size() == 1 ? "s" : "");
  });
}

}  // namespace pf
