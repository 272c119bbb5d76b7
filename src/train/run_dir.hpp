#pragma once
// A run directory (train.out_dir) is the unit the commands name, as Hugging Face's
// from_pretrained(dir) names one: it holds the run's own configuration and its weights.
//
//   RUN/config.toml                 every key of the run, paths absolute (config/paths.hpp)
//   RUN/model.safetensors           the final weights
//   RUN/checkpoints/step-000012/    a checkpoint (io/checkpoint.hpp), RUN/checkpoints/latest
//
// `train --resume`, `eval --init` and `generate --init` read the shape from the run's config.toml
// when no --config is given; --set overrides it as it overrides a --config file.
#include "config/config.hpp"

#include <string>
#include <vector>

namespace pf {

// The config.toml of the run `path` belongs to, or "" when there is none: for a directory, its
// own config.toml (a run directory), else, for a checkpoint directory (it holds `latest` or
// step-N directories) the one beside it (RUN/checkpoints -> RUN/config.toml), for a checkpoint's
// step directory the one beside its parent; for a file (RUN/model.safetensors), the one beside it.
std::string run_config_of(const std::string& path);

// The weights `--init PATH` names: for a run directory (it holds config.toml), its
// model.safetensors, else its checkpoints/ (a run stopped before its final outputs); for a
// Hugging Face model folder (config.json and model.safetensors, no config.toml) its
// model.safetensors; otherwise PATH itself (a safetensors file or a checkpoint directory).
std::string run_weights_of(const std::string& path);

// The model keys `--init PATH` brings, as from_pretrained takes the architecture from the folder:
// for a Hugging Face model folder, its config.json's (io/hf_model.hpp's hf_model_sets), applied
// before the command's own --set; none for anything else (a run directory's config.toml is the
// configuration itself). A folder with pickled weights only (pytorch_model.bin) is refused, saying
// how to convert them.
std::vector<std::string> init_model_sets(const std::string& path);

// The checkpoint directory `--resume PATH` names: for a run directory (it holds config.toml), the
// checkpoints of `cfg` (the run's configuration: train.checkpoint_dir, else RUN/checkpoints);
// otherwise PATH itself.
std::string resume_dir_of(const std::string& path, const Config& cfg);

// A run directory is relocatable (docs/checkpoints.md): `train --resume PATH` continues the run
// directory that holds PATH's checkpoints, wherever it now is, not the out_dir its config.toml
// recorded (a copy of the run would otherwise write into the original). The run directory of
// PATH (RUN for RUN, RUN/checkpoints, RUN/checkpoints/step-N: the directory of run_config_of),
// or "" when no run directory holds it.
std::string run_dir_of_resume(const std::string& resume);

// The run directory whose own config.toml `config` is (RUN/config.toml of a directory that also
// holds a run's log.jsonl or lock: a run, a copy or a moved run), or "" for any other file.
std::string run_dir_of_config(const std::string& config);

// Moves the run `cfg` configures to `run_dir`: train.out_dir, and every path under the recorded
// out_dir (checkpoints, log, plan profile), follow it. A train.log_json outside it, of a run whose
// recorded out_dir still exists (a copy), is another run's log: UsageError naming the key and both
// directories, unless `log_given` (--log-json or --set train.log_json chose it now).
void relocate_run(Config& cfg, const std::string& run_dir, bool log_given);

// The configuration file a command loads: --config when given, else the config.toml of the run
// `path` names (run_config_of), else "" (the built-in defaults).
std::string config_for(const std::string& config_flag, const std::string& path);

}  // namespace pf
