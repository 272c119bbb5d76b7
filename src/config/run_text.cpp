// A configuration described and checked as a whole (config.hpp): its preset and optimizer as a
// banner says them, the warnings, which precond.placement a run allows, the first key where two
// configurations differ.
#include "config/config.hpp"
#include "config/placement.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <map>
#include <sstream>

namespace pf {

Placement default_kfac_placement(int stages) { return stages == 1 ? Placement::Inline : Placement::Bubbles; }

namespace {
// SOAP's work (optim.name = soap): inline (in its optimizer step), skip (the same, its statistics
// gathered only on the refresh steps), bubbles (its eigenbasis refreshes as units in a pipeline's
// bubbles) or replay (following such a run's record: in one process, or under mpirun on any layout).
void check_soap_placement(const Config& c, KfacRunner runner) {
  const PlacementSpec p = placement_spec(c.kfac);
  const std::string name = name_of(c.kfac.placement);
  if (p.fills_waits)
    usage_error("precond.placement", "'{}' is not built for SOAP's work (optim.name = soap): use 'bubbles', 'inline', "
                "'skip' or 'replay'", name);
  if (runner == KfacRunner::one_process && p.planned)
    usage_error("precond.placement", "'{}' places SOAP's work in pipeline bubbles: it needs a pipeline "
                "(parallel.stages > 1); a single process runs 'inline' or 'replay' (a bubbles run's record)", name);
  if (runner == KfacRunner::mpi && p.planned && c.parallel.stages == 1)
    usage_error("precond.placement", "'{}' fills pipeline bubbles and parallel.stages = 1 has none: use 'inline'", name);
}
}  // namespace

void check_kfac_placement(const Config& c, KfacRunner runner) {
  if (places_soap_work(c)) return check_soap_placement(c, runner);
  if (!c.kfac.enabled) return;
  const PlacementSpec p = placement_spec(c.kfac);
  const std::string name = name_of(c.kfac.placement);
  if (runner == KfacRunner::one_process && p.planned)
    usage_error("kfac.placement", "'{}' places K-FAC work in pipeline bubbles: it needs a pipeline "
                "(parallel.stages > 1); a single process runs 'inline', 'skip' or 'replay' (a bubbles run's record)",
                name);
  if (runner == KfacRunner::mpi && p.planned && c.parallel.stages == 1)
    usage_error("kfac.placement", "'{}' fills pipeline bubbles and parallel.stages = 1 has none: use 'inline' "
                "(the default with one stage) or 'skip'", name);
  if (runner == KfacRunner::mpi && p.replays)
    usage_error("kfac.placement", "'replay' follows a pipeline's record in one process: run it without mpirun and "
                "--profile-dir");
}

std::string preset_of(const ModelConfig& m) {
  ModelConfig p;
  for (const std::string& name : model_preset_names()) {
    apply_model_preset(p, name);
    if (p.arch == m.arch && p.layers == m.layers && p.hidden == m.hidden && p.heads == m.heads &&
        kv_heads_of(p) == kv_heads_of(m) && p.ffn == m.ffn &&
        p.vocab == m.vocab && p.max_position == m.max_position)
      return name;
  }
  return m.preset.empty() ? "custom" : "custom (" + m.preset + ", resized)";
}

std::string optimizer_of(const Config& c) {
  if (places_soap_work(c) && c.kfac.placement != Placement::Inline) {
    const PlacementSpec p = placement_spec(c.kfac);
    if (p.planned) return "soap (its statistics and eigenbasis refreshes in the pipeline bubbles)";
    if (p.statistics_at_refreshes_only)
      return fmt::format("soap (skip: its statistics only on the refresh steps, every {})", c.optim.soap.precondition_frequency);
    return "soap (" + p.where + ")";
  }
  if (!c.kfac.enabled) return name_of(c.optim.name);
  const PlacementSpec p = placement_spec(c.kfac);
  // Stages with several copies (replicas, Chimera's twins) share an inline refresh by kfac.distributed.
  const bool copies = c.parallel.data_parallel > 1 || c.parallel.schedule == ScheduleName::Chimera;
  const bool shared = p.inline_refresh && copies;
  return fmt::format("{} + K-FAC ({}{})", c.optim.name, p.where, shared ? ", " + name_of(c.kfac.distributed) : "");
}

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> w;
  // The warm-up in effect (make_run_lr_schedule): K-FAC's own when it sets one.
  const bool kfac_own = c.kfac.enabled && c.kfac.warmup_steps >= 0;
  const int warmup = kfac_own ? c.kfac.warmup_steps : c.optim.warmup_steps;
  if (warmup > c.train.steps)
    w.push_back(fmt::format("{} = {} exceeds train.steps = {}: the learning rate never reaches optim.lr = {}",
                            kfac_own ? "kfac.warmup_steps" : "optim.warmup_steps", warmup, c.train.steps,
                            shortest_double(c.optim.lr)));
  // The rate decays over optim.decay_steps, then stays at its floor: a shorter decay than the run
  // trains its last steps at optim.min_lr (0 by default), which nobody asks for unseen.
  const OptimConfig& o = c.optim;
  if (o.decay_steps > 0 && o.decay_steps < c.train.steps && o.schedule != LrDecay::Constant)
    w.push_back(fmt::format("optim.decay_steps = {} is below train.steps = {}: from step {} on the learning rate stays "
                            "at optim.min_lr = {}", o.decay_steps, c.train.steps, o.decay_steps + 1,
                            shortest_double(o.min_lr)));
  // One stage runs each micro-batch's backward right after its forward: one micro-batch's
  // activations are held either way, so there is nothing to recompute.
  if (c.parallel.recompute && c.parallel.stages == 1)
    w.push_back("parallel.recompute = true has no effect with parallel.stages = 1: each micro-batch's backward "
                "follows its forward, so only one micro-batch's activations are held anyway");
  return w;
}

namespace {

// (key, value) in the text's order: "[table]" prefixes the keys after it; a line that is not
// "key = value" continues the previous value (a long array printed over several lines). A key
// under its old name is its current one: an older run's config.toml wrote [kfac] placement.
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
      out.emplace_back(current_key_name(table + line.substr(0, eq)), line.substr(eq + 3));
    } else if (!out.empty()) {
      out.back().second += " " + line;
    }
  }
  return out;
}

}  // namespace

KeyDifference first_difference(const std::string& a, const std::string& b, const std::vector<std::string>& ignored) {
  const auto in_a = key_values(a), in_b = key_values(b);
  const std::map<std::string, std::string> map_a(in_a.begin(), in_a.end()), map_b(in_b.begin(), in_b.end());
  auto compared = [&](const std::string& key) { return std::find(ignored.begin(), ignored.end(), key) == ignored.end(); };
  for (const auto& [key, value] : in_a) {
    if (!compared(key)) continue;
    const auto it = map_b.find(key);
    if (it == map_b.end()) return {key, value, "(absent)"};
    if (it->second != value) return {key, value, it->second};
  }
  for (const auto& [key, value] : in_b)
    if (compared(key) && !map_a.count(key)) return {key, "(absent)", value};
  return {};
}

}  // namespace pf
