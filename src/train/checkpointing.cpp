#include "train/checkpointing.hpp"

#include "core/error.hpp"
#include "core/files.hpp"
#include "io/safetensors.hpp"
#include "train/kfac_replay.hpp"
#include "nn/model.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace pf {

namespace {

int64_t sequences_per_step(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return static_cast<int64_t>(p.data_parallel) * p.micro_batches * p.micro_batch_size;
}

// The checkpoint ends the run that wrote it: its step is that run's train.steps.
bool ends_its_run(const CheckpointManifest& m) {
  auto it = m.info.find("train.steps");
  return it != m.info.end() && it->second == std::to_string(m.step);
}

// `latest` of a checkpoint directory as it reads now ("" when there is none).
std::string latest_name(const std::string& dir) {
  std::ifstream f(std::filesystem::path(dir) / "latest");
  std::string name;
  std::getline(f, name);
  return name;
}

// The newest complete checkpoint of `dir`, opened (its files mapped: kept while the reader
// lives). A run writing there may rotate away the one found before it is opened: when `latest`
// moved or the checkpoint it named is gone, found again, a few times; then a UsageError saying
// the run is writing (a run checkpointing every few milliseconds outpaces the verification).
std::unique_ptr<CheckpointReader> open_latest(const std::string& dir, const std::string& what,
                                              std::string* passed_over) {
  constexpr int kAttempts = 10;
  for (int attempt = 1;; ++attempt) {
    const std::string before = latest_name(dir);
    try {
      return std::make_unique<CheckpointReader>(find_latest_checkpoint(dir, what, passed_over));
    } catch (const UsageError&) {
      std::error_code ec;
      const bool moved = latest_name(dir) != before ||
                         (!before.empty() && !std::filesystem::exists(std::filesystem::path(dir) / before, ec));
      if (!moved) throw;  // a fault of the checkpoints themselves
      if (attempt == kAttempts)
        usage_error(what, "the checkpoints in '{}' changed {} times while being opened: a run is writing there "
                    "(open them when it is done, or name one of its step directories)", dir, kAttempts);
    }
  }
}

}  // namespace

std::map<std::string, std::string> checkpoint_info(const Config& cfg, int64_t step, const std::string& layout) {
  const int64_t g = sequences_per_step(cfg);
  return {
      {"train.seed", std::to_string(cfg.train.seed)},
      {"data.seed", std::to_string(cfg.data.seed)},
      {"data.shuffle", cfg.data.shuffle ? "true" : "false"},
      {"sequences_per_step", std::to_string(g)},
      {"data_position", std::to_string(step * g)},  // next sequence index the run reads
      {"dropout_rng", fmt::format("(train.seed, step) = ({}, {})", cfg.train.seed, step)},
      {"optim.name", name_of(cfg.optim.name)},
      {"kfac.enabled", cfg.kfac.enabled ? "true" : "false"},
      {"train.steps", std::to_string(cfg.train.steps)},
      {"lr_decay_steps", std::to_string(cfg.optim.decay_steps > 0 ? cfg.optim.decay_steps : cfg.train.steps)},
      {"layout", layout},
      // The model's shape: a resume into another one is refused naming the key.
      {"model.arch", name_of(cfg.model.arch)},
      {"model.layers", std::to_string(cfg.model.layers)},
      {"model.hidden", std::to_string(cfg.model.hidden)},
      {"model.heads", std::to_string(cfg.model.heads)},
      {"model.kv_heads", std::to_string(cfg.model.kv_heads)},
      {"model.tie_embeddings", cfg.model.tie_embeddings ? "true" : "false"},
      {"model.ffn", std::to_string(cfg.model.ffn)},
      {"model.vocab", std::to_string(cfg.model.vocab)},
      {"model.max_position", std::to_string(cfg.model.max_position)},
  };
}

void require_init_path(const std::string& init) {
  std::error_code ec;
  if (std::filesystem::is_directory(init, ec) || std::filesystem::is_regular_file(init, ec)) return;
  if (!std::filesystem::exists(init, ec)) usage_error("--init", "no such file or checkpoint directory '{}'", init);
  require_input_file(init, "--init", "");  // names what is there instead: a FIFO, a device
}

std::unique_ptr<CheckpointReader> open_init_checkpoint(const std::string& init, const std::string& resume,
                                                       const ModelConfig& model) {
  if (!init.empty()) require_init_path(init);
  const bool dir = !init.empty() && std::filesystem::is_directory(init);
  if (!init.empty() && !resume.empty()) usage_error("--init", "give --init or --resume, not both");
  std::unique_ptr<CheckpointReader> ckpt;
  if (dir) ckpt = open_latest(init, "--init", nullptr);
  if (!init.empty()) check_weights_fit(model, init, ckpt.get());
  return ckpt;
}

namespace {

// A file write_stage_state wrote: "weights-stage-S.safetensors" (kind "weights") or "state-stage-S...".
bool is_stage_file(const std::string& path, const std::string& kind) {
  return std::filesystem::path(path).filename().string().rfind(kind + "-stage-", 0) == 0;
}

}  // namespace

void check_weights_fit(const ModelConfig& model, const std::string& file, const CheckpointReader* ckpt) {
  std::set<std::string, std::less<>> names;
  for (int b = 0; b < num_blocks(model); ++b) {
    const std::unique_ptr<Model> block = build_model(model, b, b);  // loaded for its checks, then dropped
    const std::vector<Param*> params = block->params();
    if (ckpt)
      ckpt->load_params(params);
    else
      load_safetensors(file, params);
    for (const Param* p : params) names.insert(p->name);
  }
  if (!ckpt) return;
  for (const auto& f : ckpt->files()) {
    const bool weights = is_stage_file(f->path(), "weights");
    if (!weights && !is_stage_file(f->path(), "state")) continue;  // another file's own loader checks it
    for (const SafetensorsEntry& e : f->tensors()) {
      if (!weights)
        f->require_finite(e);  // the optimizer's and K-FAC's state; the weights were loaded above
      else if (!names.count(e.name))
        usage_error(f->path(), "tensor '{}' is not a parameter of the configured model ({}, model.layers = {}, "
                    "model.hidden = {}): the checkpoint is of another model", e.name, model.arch, model.layers,
                    model.hidden);
    }
  }
}

void load_init_weights(const std::string& init, const CheckpointReader* ckpt, const std::vector<Param*>& params) {
  if (ckpt) return ckpt->load_params(params);
  if (init.empty()) return;
  const SafetensorsLoadResult r = load_safetensors(init, params);
  // A hub file holds more than our model uses (attention-mask buffers, an untied copy of the
  // decoder, heads we lack): say which, so that nothing is dropped unseen.
  if (r.unused.empty()) return;
  std::string names;
  for (size_t i = 0; i < r.unused.size() && i < 8; ++i) names += (i ? ", " : "") + r.unused[i];
  if (r.unused.size() > 8) names += fmt::format(", ... ({} more)", r.unused.size() - 8);
  std::fprintf(stderr, "--init: %zu of %zu tensors in %s not used by the model: %s\n", r.unused.size(),
               r.unused.size() + r.loaded.size(), init.c_str(), names.c_str());
}

void check_resume(const Config& cfg, const CheckpointManifest& m) {
  const auto now = checkpoint_info(cfg, m.step, "");
  const std::pair<const char*, const char*> keys[] = {
      {"model.arch", "model.arch"},
      {"model.layers", "model.layers"},
      {"model.hidden", "model.hidden"},
      {"model.heads", "model.heads"},
      {"model.kv_heads", "model.kv_heads"},
      {"model.tie_embeddings", "model.tie_embeddings"},
      {"model.ffn", "model.ffn"},
      {"model.vocab", "model.vocab"},
      {"model.max_position", "model.max_position"},
      {"train.seed", "train.seed"},
      {"data.seed", "data.seed"},
      {"data.shuffle", "data.shuffle"},
      {"sequences_per_step", "parallel.micro_batches"},  // x micro_batch_size x data_parallel
      {"optim.name", "optim.name"},
      {"kfac.enabled", "kfac.enabled"},
  };
  for (auto [fact, key] : keys) {
    auto it = m.info.find(fact);
    if (it == m.info.end()) continue;  // not recorded: nothing to compare
    if (it->second != now.at(fact))
      usage_error(key, "the checkpoint at step {} was written with {} = {}, this configuration has {}", m.step, fact,
                  it->second, now.at(fact));
  }
}

void check_kfac_layout(const Config& cfg, const CheckpointManifest& m, const std::string& layout, const std::string& dir) {
  if (!cfg.kfac.enabled) return;
  auto it = m.info.find("layout");
  const std::string was = it == m.info.end() ? "an unrecorded layout" : it->second;
  if (was != layout)
    usage_error("--resume", "the checkpoint's K-FAC state was written by {}, this run is {}: it continues only in "
                "the same layout (start from its weights with --init {})", was, layout, dir);
}

std::string keep_lr_schedule(Config& cfg, const CheckpointManifest& m) {
  auto it = m.info.find("lr_decay_steps");
  if (it == m.info.end()) it = m.info.find("train.steps");  // written before lr_decay_steps was recorded
  if (it == m.info.end()) return "";
  char* end = nullptr;
  const long long was = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || was < 1) return "";
  OptimConfig& o = cfg.optim;
  const long long now = o.decay_steps > 0 ? o.decay_steps : cfg.train.steps;
  if (now == was) return "";
  if (o.decay_steps > 0)
    return fmt::format("the learning rate decays over optim.decay_steps = {} steps from here (the checkpoint's run: {})",
                       now, was);
  // Longer: the checkpoint's schedule reaches 0 at its run's end, so the extension decays over the
  // new length from here (Hugging Face's resume with a larger max_steps).
  if (cfg.train.steps > was)
    return fmt::format("train.steps = {} extends the checkpoint's run of {} steps: from here the learning rate follows "
                       "the schedule of a run of {} steps (optim.decay_steps chooses another)", cfg.train.steps, was,
                       cfg.train.steps);
  o.decay_steps = static_cast<int>(was);
  return fmt::format("train.steps = {}: the run stops early, its learning rate keeps the checkpoint's schedule (decay "
                     "over {} steps)", cfg.train.steps, was);
}

std::unique_ptr<CheckpointReader> open_resume_checkpoint(Config& cfg, const std::string& dir, const std::string& what,
                                                         std::vector<std::string>& notes) {
  std::string passed_over;
  std::unique_ptr<CheckpointReader> r = open_latest(dir, what, &passed_over);
  if (!passed_over.empty()) notes.push_back(what + ": " + passed_over + "; resuming from the newest that verifies");
  check_resume(cfg, r->manifest());
  check_weights_fit(cfg.model, "", r.get());
  const int64_t at = r->manifest().step;
  if (at > cfg.train.steps || (at == cfg.train.steps && !ends_its_run(r->manifest())))
    usage_error(what, "the checkpoint is at step {}, train.steps is {}: nothing left to train{}", r->manifest().step,
                cfg.train.steps, what == "--resume" ? "" : " (--overwrite starts the run over)");
  if (std::string n = keep_lr_schedule(cfg, r->manifest()); !n.empty()) notes.push_back(what + ": " + n);
  return r;
}

void require_finite(std::span<const float> values, const std::string& tensor, const std::string& path) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      usage_error(path, "tensor '{}' holds a non-finite value ({} at index {}): not written (the training diverged; "
                  "a smaller optim.lr?)", tensor, values[i], i);
}

void require_finite(const std::vector<const Param*>& params, const std::string& path) {
  for (const Param* p : params) require_finite(p->value.span(), p->name, path);
}

void save_trained_weights(const std::string& path, const std::vector<const Param*>& params) {
  require_finite(params, path);
  save_safetensors(OutputFile{path, "--save", true}, params);
}

std::vector<CheckpointFile> write_stage_state(const std::string& step_dir, int stage, const TrainState& st) {
  std::vector<SafetensorsTensor> weights, state;
  for (const Param* p : st.params)
    if (!p->mirror) weights.push_back(param_tensor(*p));  // the layout load_params reads (GPT-2's Conv1D [in, out])
  // Optimizer state of mirrors equals their owner's (same gradients, same updates): left out.
  st.optim->settle();
  for (auto& [name, t] : st.optim->state_tensors()) {
    const std::string owner = name.substr(0, name.rfind('.'));
    bool mirror = false;
    for (const Param* p : st.params) mirror |= p->mirror && p->name == owner;
    if (!mirror) state.push_back({name, t->shape(), t->span(), false});
  }
  NamedTensors kfac;
  if (st.kfac) kfac = st.kfac->state();
  if (st.kfac_replay)
    for (auto& kv : st.kfac_replay->state()) kfac.push_back(std::move(kv));
  for (const auto& [name, t] : kfac) state.push_back({name, t.shape(), t.span(), false});
  SafetensorsMetadata meta{{"optimizer", st.optim->name()}, {"optimizer_steps", std::to_string(st.optim->step_count())}};
  for (const auto& files : {std::pair{&weights, "weights"}, std::pair{&state, "state"}})
    for (const SafetensorsTensor& t : *files.first)
      require_finite(t.data, t.name, fmt::format("{}/{}-stage-{}.safetensors", step_dir, files.second, stage));
  std::vector<CheckpointFile> out;
  out.push_back(write_checkpoint_tensors(step_dir, fmt::format("weights-stage-{}.safetensors", stage), weights));
  out.push_back(write_checkpoint_tensors(step_dir, fmt::format("state-stage-{}.safetensors", stage), state, meta));
  return out;
}

void load_train_state(const CheckpointReader& r, const TrainState& st) {
  r.load_params(st.params);
  for (auto& [name, t] : st.optim->state_tensors()) r.read(name, t->shape(), t->span());
  const std::string steps = r.state_metadata("optimizer_steps");
  char* end = nullptr;
  const long long n = std::strtoll(steps.c_str(), &end, 10);
  if (steps.empty() || *end != '\0' || n < 0) usage_error(r.dir(), "no valid \"optimizer_steps\" in the state files");
  st.optim->set_step_count(n);
  // A replay's factors are re-partitioned as of the checkpoint's step before they load.
  if (st.kfac_replay) st.kfac_replay->prepare_resume(r.manifest().step);
  if (st.kfac) {
    NamedTensors kfac = st.kfac->state();  // names and shapes, filled from the checkpoint
    for (auto& [name, t] : kfac) r.read(name, t.shape(), t.span());
    st.kfac->load_state(kfac);
  }
  if (st.kfac_replay) {
    NamedTensors kept = st.kfac_replay->state();
    for (auto& [name, t] : kept) r.read(name, t.shape(), t.span());
    st.kfac_replay->load_state(kept);
  }
}

std::string last_checkpoint_note(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string name;
  if (FILE* f = std::fopen((fs::path(dir) / "latest").c_str(), "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof buf, f)) name = buf;
    std::fclose(f);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path step = fs::path(dir) / name;
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos ||
      !fs::is_regular_file(step / "manifest.json", ec))
    return fmt::format("no complete checkpoint in {}", dir);
  return fmt::format("the last complete checkpoint is {}: continue with --resume {}", step.string(), dir);
}

bool checkpoints_on(const Config& cfg) { return cfg.train.checkpoint_every > 0; }

std::string checkpoint_dir_of(const Config& cfg) {
  if (!cfg.train.checkpoint_dir.empty()) return cfg.train.checkpoint_dir;
  return (std::filesystem::path(cfg.train.out_dir) / "checkpoints").string();
}

}  // namespace pf
