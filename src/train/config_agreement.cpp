#include "train/config_agreement.hpp"

#include "comm/collectives.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <utility>
#include <vector>

namespace pf {
namespace {

// A value as a message shows it: whole unless long.
std::string shown(const std::string& v) { return v.size() <= 80 ? v : v.substr(0, 77) + "..."; }

}  // namespace

std::string canonical_run_text(const Config& cfg, const TrainRunArgs& args) {
  const auto quoted = [](const std::string& s) { return fmt::format("'{}'", s); };
  return fmt::format("--init = {}\n--save = {}\n--resume = {}\n--profile-dir = {}\n--overwrite = {}\n{}",
                     quoted(args.init), quoted(args.save), quoted(args.resume), quoted(args.profile_dir),
                     args.overwrite, cfg.to_toml());
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
