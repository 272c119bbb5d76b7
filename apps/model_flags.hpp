#pragma once
// The flags `pipefisher eval` and `generate` share with `train` to name a model and its weights
// (--config, --set, --init), and the whole model they describe, built and loaded.
#include "config/config.hpp"
#include "nn/model.hpp"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

namespace pf::app {

struct ModelFlags {
  std::string config, init;
  std::vector<std::string> sets;
};

void add_model_flags(CLI::App& cmd, ModelFlags& f);

struct LoadedModel {
  Config cfg;
  std::unique_ptr<Model> model;  // the whole model, with the --init weights
};

// The configuration (validated: --config, else the config.toml of the run --init names, with
// --set over it) and the --init path checked (required: a run directory, a safetensors file or a
// checkpoint directory); UsageError naming the flag or key.
Config load_model_config(const ModelFlags& f, const char* command);
// Runs train's memory check (check_resources: UsageError naming the key), sets the thread count
// from cfg, builds the whole model and loads the --init weights into it (a run directory's
// model.safetensors).
LoadedModel load_model(const ModelFlags& f, const Config& cfg);

}  // namespace pf::app
