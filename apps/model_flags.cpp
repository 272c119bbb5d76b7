#include "model_flags.hpp"

#include "config/limits.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "train/checkpointing.hpp"
#include "train/run_dir.hpp"

namespace pf::app {

void add_model_flags(CLI::App& cmd, ModelFlags& f) {
  cmd.add_option("--config", f.config,
                 "TOML configuration file of the model (default: the config.toml of the run --init names, else "
                 "the built-in default job's)");
  cmd.add_option("--set", f.sets, "override a configuration key: --set model.layers=4 (repeatable)")
      ->allow_extra_args(false);
  cmd.add_option("--init", f.init,
                 "the weights: a run directory (train.out_dir: its model.safetensors and config.toml), a Hugging "
                 "Face model folder (model.safetensors and config.json), a safetensors file or a checkpoint "
                 "directory (required)");
}

Config load_model_config(const ModelFlags& f, const char* command) {
  std::vector<std::string> sets = init_model_sets(f.init);  // a Hugging Face folder's shape, then --set
  sets.insert(sets.end(), f.sets.begin(), f.sets.end());
  Config cfg = Config::load(config_for(f.config, f.init), sets);
  resolve_data_parallel(cfg, cfg.parallel.stages);  // one process: the memory check counts one replica
  if (f.init.empty())
    usage_error("--init", "{} needs the weights: --init RUN_DIR (a run's out_dir), FILE.safetensors or a checkpoint "
                "directory", command);
  require_init_path(f.init);  // now; the weights are checked as load_model loads them
  return cfg;
}

LoadedModel load_model(const ModelFlags& f, const Config& cfg) {
  LoadedModel m{cfg, nullptr};
  // train's memory check, before any tensor of the model is made (a shape from a Hugging Face
  // config.json or --set that no memory holds is refused naming the key, not std::bad_alloc); it
  // includes ulimit -v's, under which OpenBLAS spins for ever on a buffer it cannot map.
  check_resources(cfg);
  const std::string weights = run_weights_of(f.init);
  std::unique_ptr<CheckpointReader> ckpt = open_init_checkpoint(weights, "", cfg.model);
  set_threads(cfg.train.threads);
  m.model = build_model(cfg.model, 0, num_blocks(cfg.model) - 1);
  m.model->init(cfg.train.seed);
  load_init_weights(weights, ckpt.get(), m.model->params());
  return m;
}

}  // namespace pf::app
