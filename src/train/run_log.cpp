#include "train/run_log.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "core/machine.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace pf {

RunLog::RunLog(int total_steps, int log_every, std::vector<std::string> json_paths)
    : total_(total_steps), every_(log_every), tty_(isatty(fileno(stderr))), machine_(machine_info()) {
  // First, so that every number the run prints can be traced to the machine that made it.
  std::printf("machine: %s\n", machine_line(machine_).c_str());
  for (const auto& p : json_paths) {
    FILE* f = std::fopen(p.c_str(), "w");
    if (!f) usage_error(p, "cannot open the log file for writing");
    json_.push_back(f);
  }
}

RunLog::~RunLog() {
  for (FILE* f : json_) std::fclose(f);
}

void RunLog::step(const StepStats& s, std::optional<double> valid_loss) {
  if (steps_ == 0) first_loss_ = s.loss;
  last_loss_ = s.loss;
  ++steps_;
  tokens_ += static_cast<double>(s.tokens);
  busy_s_ += s.step_time_s;
  const double tps = s.step_time_s > 0 ? static_cast<double>(s.tokens) / s.step_time_s : 0;

  nlohmann::json j{{"step", s.step + 1}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
                   {"tokens", s.tokens}, {"step_time_s", s.step_time_s}, {"tokens_per_s", tps}};
  if (valid_loss) j["valid_loss"] = *valid_loss;
  const std::string line = j.dump() + "\n";
  for (FILE* f : json_) {
    std::fputs(line.c_str(), f);
    std::fflush(f);
  }

  const std::string text = fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s", s.step + 1,
                                       fmt::formatted_size("{}", total_), total_, s.loss, s.lr, tps);
  const std::string valid = valid_loss ? fmt::format(" | valid {:.4f}", *valid_loss) : "";
  const bool last = s.step + 1 == total_;
  if (tty_) {
    // A status line rewritten in place; validation results and the last step stay on screen.
    std::fprintf(stderr, "\r%s%s\033[K%s", text.c_str(), valid.c_str(), (valid_loss || last) ? "\n" : "");
  } else if ((s.step + 1) % every_ == 0 || s.step == 0 || last || valid_loss) {
    std::fprintf(stdout, "%s%s\n", text.c_str(), valid.c_str());
    std::fflush(stdout);
  }
}

std::string RunLog::summary(double final_valid_loss, double wall_s) const {
  nlohmann::json j{{"steps", steps_},
                   {"first_loss", first_loss_},
                   {"final_loss", last_loss_},
                   {"final_valid_loss", final_valid_loss},
                   {"tokens", tokens_},
                   {"tokens_per_s", busy_s_ > 0 ? tokens_ / busy_s_ : 0.0},
                   {"wall_time_s", wall_s},
                   {"machine",
                    {{"cpu", machine_.cpu},
                     {"blas", machine_.blas},
                     {"blas_kernel", machine_.kernel},
                     {"blas_kernel_chosen_by", machine_.kernel_chosen_by},
                     {"threads", machine_.threads},
                     {"omp_wait_policy", machine_.wait_policy},
                     {"load_average_at_start", machine_.load_average}}}};
  std::fprintf(stdout, "summary: %lld steps, loss %.4f -> %.4f, validation loss %.4f, %.0f tokens/s, %.1f s\n",
               static_cast<long long>(steps_), first_loss_, last_loss_, final_valid_loss,
               j["tokens_per_s"].get<double>(), wall_s);
  return j.dump(2) + "\n";
}

std::unique_ptr<RunLog> open_run_outputs(const Config& cfg) {
  const std::string& out = cfg.train.out_dir;
  make_dirs(out, "train.out_dir");
  write_file_atomic(out + "/config.toml", cfg.to_toml());
  std::vector<std::string> logs{out + "/log.jsonl"};
  if (!cfg.train.log_json.empty()) logs.push_back(cfg.train.log_json);
  return std::make_unique<RunLog>(cfg.train.steps, cfg.train.log_every, std::move(logs));
}

}  // namespace pf
