#include "schedule/torch_csv.hpp"

#include "core/error.hpp"
#include "schedule/deps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

namespace pf {

namespace {

// torch's _action_regex: stage, type, optional micro-batch.
const std::regex kTorchAction(R"((\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*))");
constexpr size_t kMaxIndexDigits = 6;  // stages and micro-batches up to 999999

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::istringstream row(line);
  for (std::string c; std::getline(row, c, ',');) cells.push_back(trimmed(c));
  return cells;
}

// The rows of the text: every line, less trailing empty ones. Each counts one cell (`count`),
// its commas one more each (parse_torch_csv).
std::vector<std::string> rows_of(const std::string& text, int64_t& count, const std::string& source) {
  std::vector<std::string> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    count_schedule_cells(count, 1, source);
    rows.push_back(line);
  }
  while (!rows.empty() && trimmed(rows.back()).empty()) rows.pop_back();
  return rows;
}

// Every stage 0 .. S-1 on one rank, from where the file put them.
std::vector<int> stage_ranks(const std::map<int, int>& rank_of, const std::string& source) {
  const int stages = rank_of.empty() ? 0 : rank_of.rbegin()->first + 1;
  std::vector<int> ranks(static_cast<size_t>(stages), -1);
  for (const auto& [stage, rank] : rank_of) ranks[static_cast<size_t>(stage)] = rank;
  for (int st = 0; st < stages; ++st)
    if (ranks[static_cast<size_t>(st)] < 0)
      usage_error(source, "no row has an action of stage {} (the stages are 0 to {})", st, stages - 1);
  if (stages == 0) usage_error(source, "no action: one row per rank of cells such as 0F0, 0B0");
  return ranks;
}

}  // namespace

std::string to_torch_csv(const Schedule& s, const std::string& what) {
  if (s.pipelines != 1)
    usage_error(what, "'{}' runs {} pipelines (Chimera's two directions): torch.distributed.pipelining's schedule "
                "CSV has no form for it", s.name, s.pipelines);
  const UnitSteps st = unit_steps(s, build_dependencies(s));
  std::string out;
  for (int d = 0; d < s.devices; ++d) {
    std::vector<std::string> cells;
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      const Action& a = s.per_device[d][i];
      if (!is_pass(a.kind))
        usage_error(what, "'{}' has a {} action: torch's compute_only form holds F, B, I and W only", s.name,
                    kind_name(a.kind));
      const size_t at = st.complete ? static_cast<size_t>(st.step[d][i]) : cells.size();
      cells.resize(std::max(cells.size(), at), "");
      cells.push_back(fmt::format("{}{}{}", a.stage, kind_name(a.kind), a.micro_batch));
    }
    out += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return out;
}

Schedule parse_torch_csv(const std::string& text, const std::string& source) {
  int64_t count = 0;
  const std::vector<std::string> rows = rows_of(text, count, source);
  Schedule s;
  s.name = "file";
  s.devices = static_cast<int>(rows.size());
  s.per_device.resize(rows.size());
  std::map<int, int> rank_of;  // stage -> rank
  int micro_batches = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    count_schedule_cells(count, std::count(rows[r].begin(), rows[r].end(), ','), source);
    const std::vector<std::string> cells = cells_of(rows[r]);
    for (size_t c = 0; c < cells.size(); ++c) {
      if (cells[c].empty()) continue;  // idle
      const std::string where = fmt::format("{}:{}:{}", source, r + 1, c + 1);
      std::smatch m;
      if (!std::regex_match(cells[c], m, kTorchAction))
        usage_error(where, "'{}' is not a torch.distributed.pipelining action (stage, F/I/B/W or a communication, "
                    "micro-batch: 0F0, 2I3)", cells[c]);
      const std::optional<Kind> kind = kind_from_name(m[2].str());
      if (!kind || !is_pass(*kind)) continue;  // communication and sharding: derived or not ours
      if (m[3].length() == 0) usage_error(where, "'{}' has no micro-batch (0F0, not 0F)", cells[c]);
      for (const auto& [index, name] : {std::pair{m[1].str(), "stage"}, {m[3].str(), "micro-batch"}})
        if (index.size() > kMaxIndexDigits)
          usage_error(where, "'{}': {} {} is over the bound of 999999", cells[c], name, index);
      const int stage = std::stoi(m[1]), mb = std::stoi(m[3]);
      const auto [it, fresh] = rank_of.emplace(stage, static_cast<int>(r));
      if (!fresh && it->second != static_cast<int>(r))
        usage_error(where, "'{}': stage {} is on rank {} already (row {}); a stage lives on one rank", cells[c], stage,
                    it->second, it->second + 1);
      s.per_device[r].push_back(act(*kind, stage, mb));
      micro_batches = std::max(micro_batches, mb + 1);
    }
  }
  const std::vector<int> ranks = stage_ranks(rank_of, source);
  s.stages = static_cast<int>(ranks.size());
  s.micro_batches = micro_batches;
  s.stage_device = {ranks};
  return s;
}

bool is_torch_csv(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  return b == std::string::npos || text.compare(b, 1, "#") != 0;
}

}  // namespace pf
