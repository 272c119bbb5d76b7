#include "schedule/schedule.hpp"
#include "schedule/torch_csv.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "schedule/deps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace pf {

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& v : per_device) n += v.size();
  return n;
}

std::vector<std::vector<int>> default_stage_device(int devices, int stages, int pipelines) {
  std::vector<std::vector<int>> map(pipelines, std::vector<int>(stages));
  for (int p = 0; p < pipelines; ++p)
    for (int s = 0; s < stages; ++s) map[p][s] = p == 1 ? devices - 1 - s % devices : s % devices;
  return map;
}

namespace {

std::string header(const Schedule& s) {
  std::string h = fmt::format("# pipefisher schedule name={} devices={} stages={} pipelines={} micro_batches={}\n",
                              s.name.empty() ? "file" : s.name, s.devices, s.stages, s.pipelines,
                              s.micro_batches);
  for (int p = 0; p < s.pipelines; ++p) h += fmt::format("# map p{}: {}\n", p, fmt::join(s.stage_device[p], " "));
  return h;
}

// A header number; refused (not std::out_of_range or a huge allocation) above 100000.
int header_number(const std::string& digits, const std::string& where) {
  if (digits.size() > 6 || std::stoi(digits) > 100000) usage_error(where, "header number {} is too large", digits);
  return std::stoi(digits);
}

// Parses the '#' header lines shared by both forms; returns false for a non-header line.
bool parse_header_line(const std::string& line, Schedule& s, const std::string& where) {
  static const std::regex head(
      R"(^#\s*pipefisher schedule\s+name=(\S+)\s+devices=(\d+)\s+stages=(\d+)\s+pipelines=(\d+)\s+micro_batches=(\d+)\s*$)");
  static const std::regex map(R"(^#\s*map p(\d+):((?:\s+\d+)*)\s*$)");
  std::smatch m;
  if (line.empty() || line[0] != '#') return false;
  if (std::regex_match(line, m, head)) {
    s.name = m[1];
    s.devices = header_number(m[2], where);
    s.stages = header_number(m[3], where);
    s.pipelines = header_number(m[4], where);
    s.micro_batches = header_number(m[5], where);
    if (s.devices < 1 || s.stages < 1 || s.pipelines < 1 || s.pipelines > 2 || s.micro_batches < 1)
      usage_error(where, "header needs devices, stages, micro_batches >= 1 and pipelines 1 or 2");
    s.stage_device = default_stage_device(s.devices, s.stages, s.pipelines);
    s.per_device.assign(s.devices, {});
  } else if (std::regex_match(line, m, map)) {
    int p = header_number(m[1], where);
    if (s.devices == 0) usage_error(where, "'# map' line before the '# pipefisher schedule' header");
    if (p >= s.pipelines) usage_error(where, "map for pipeline {} but pipelines={}", p, s.pipelines);
    std::istringstream in(m[2].str());
    std::vector<int> devs;
    for (int d; in >> d;) {
      if (d >= s.devices) usage_error(where, "map: device {} out of range (devices={})", d, s.devices);
      devs.push_back(d);
    }
    if (static_cast<int>(devs.size()) != s.stages)
      usage_error(where, "map p{} lists {} devices, expected one per stage ({})", p, devs.size(), s.stages);
    s.stage_device[p] = devs;
  }
  return true;  // other '#' lines are comments
}

void check_header_seen(const Schedule& s, const std::string& source) {
  if (s.devices == 0)
    usage_error(source, "missing header line '# pipefisher schedule name=.. devices=.. stages=.. pipelines=.. micro_batches=..'");
}

int parse_device(const std::string& cell, const Schedule& s, const std::string& where) {
  static const std::regex num(R"(^\s*(\d+)\s*$)");
  std::smatch m;
  if (!std::regex_match(cell, m, num)) usage_error(where, "expected a device index, got '{}'", cell);
  int d = header_number(m[1], where);
  if (d >= s.devices) usage_error(where, "device {} out of range (devices={})", d, s.devices);
  return d;
}

}  // namespace

std::string to_text(const Schedule& s) {
  std::string out = header(s);
  for (int d = 0; d < s.devices; ++d) {
    out += std::to_string(d) + ":";
    for (const Action& a : s.per_device[d]) out.append(" ").append(to_token(a));
    out += "\n";
  }
  return out;
}

// The line loop both forms share: '#' header lines fill `s`; every other non-blank line (blank =
// only characters of `blank`) goes to on_row(line, "source:line") once the header is complete.
template <typename OnRow>
Schedule parse_lines(const std::string& text, const std::string& source, const char* blank, OnRow on_row) {
  Schedule s;
  std::istringstream in(text);
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string where = fmt::format("{}:{}", source, ln);
    if (line.find_first_not_of(blank) == std::string::npos) continue;
    if (parse_header_line(line, s, where)) continue;
    check_header_seen(s, source);
    on_row(s, line, where);
  }
  check_header_seen(s, source);
  return s;
}

Schedule parse_text(const std::string& text, const std::string& source) {
  int64_t count = 0;
  return parse_lines(text, source, " \t", [&](Schedule& s, const std::string& line, const std::string& where) {
    auto colon = line.find(':');
    if (colon == std::string::npos) usage_error(where, "expected '<device>: <actions...>'");
    int d = parse_device(line.substr(0, colon), s, where);
    std::istringstream toks(line.substr(colon + 1));
    for (std::string t; toks >> t;) {
      count_schedule_cells(count, 1, source);
      s.per_device[d].push_back(parse_token(t, where));
    }
  });
}

std::string to_csv(const Schedule& s) {
  // Align actions to their unit-time step so columns read as time; a schedule that deadlocks
  // (only possible for hand-written ones) falls back to packed rows.
  UnitSteps st = unit_steps(s, build_dependencies(s));
  std::string out = header(s);
  for (int d = 0; d < s.devices; ++d) {
    out += std::to_string(d);
    int col = 0;
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      int target = st.complete ? st.step[d][i] : static_cast<int>(i);
      for (; col < target; ++col) out += ",";
      out.append(",").append(to_token(s.per_device[d][i]));
      ++col;
    }
    out += "\n";
  }
  return out;
}

void count_schedule_cells(int64_t& cells, int64_t more, const std::string& source) {
  cells += more;
  if (cells > kMaxScheduleCells)
    usage_error(source, "over {} cells (actions and idle steps): more than any schedule the simulator takes",
                kMaxScheduleCells);
}

Schedule parse_csv(const std::string& text, const std::string& source) {
  int64_t count = 0;
  return parse_lines(text, source, " \t,", [&](Schedule& s, const std::string& line, const std::string& where) {
    count_schedule_cells(count, std::count(line.begin(), line.end(), ',') + 1, source);
    std::vector<std::string> cells;
    std::istringstream row(line);
    for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
    int d = parse_device(cells[0], s, where);
    for (size_t c = 1; c < cells.size(); ++c) {
      auto b = cells[c].find_first_not_of(" \t"), e = cells[c].find_last_not_of(" \t");
      if (b == std::string::npos) continue;  // idle step
      s.per_device[d].push_back(parse_token(cells[c].substr(b, e - b + 1), fmt::format("{}:{}", where, c + 1)));
    }
  });
}

Schedule read_schedule_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) usage_error(what, "'{}' is a directory, not a schedule file", path);
  const std::string text = read_input_file(path, what, kMaxScheduleFileBytes);
  bool csv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  if (csv && is_torch_csv(text)) return parse_torch_csv(text, path);  // torch.distributed.pipelining's form
  return csv ? parse_csv(text, path) : parse_text(text, path);
}

}  // namespace pf
