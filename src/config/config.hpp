#pragma once
// The run configuration: one struct per TOML table. Every key has a default; a TOML file and
// `--set key=value` overrides change them; `validate()` refuses impossible values with a
// UsageError naming the key. Unknown keys are refused too, so a typo never goes unnoticed.
// Each key is declared once (config_keys.hpp: name, member, bounds, meaning), and reading,
// validating, printing and describing (docs/config.md) all follow that declaration.
#include "config/enums.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pf {

struct ModelConfig {
  // Defaults: bert-mini's shape (the built-in default job).
  std::string preset;          // bert-tiny, bert-mini, ..., gpt2-small: sets the sizes below
  Arch arch = Arch::Bert;      // bert (post-LN, MLM head) | gpt (pre-LN, causal LM head) | llama
  int layers = 4;
  int hidden = 256;
  int heads = 4;
  // llama: key/value heads (grouped-query attention; heads must divide by it). 0 until the loader
  // fills it: model.heads (every head its own keys and values, the only choice for bert and gpt).
  int kv_heads = 0;
  double rope_theta = 10000;   // llama: the base of the rotary position embedding's frequencies
  // The LM head's matrix is the word embedding's (bert and gpt always; llama may have its own,
  // lm_head.weight, as Hugging Face's tie_word_embeddings = false).
  bool tie_embeddings = true;
  int ffn = 1024;
  int seq_len = 128;           // tokens per sequence
  int max_position = 512;      // size of the position-embedding table (gpt: 1024)
  int vocab = 30522;           // gpt: 50257
  int type_vocab = 2;          // BERT token types (unused by gpt)
  float dropout = 0.0f;        // off by default
  float layer_norm_eps = 1e-12f;
  float init_std = 0.02f;
  std::optional<Gelu> gelu;    // erf (BERT) | tanh (GPT-2); unset ("") = the architecture's own
  // How many labelled rows' logits the head holds at once (HeadBlock::decoder_pass): the (rows,
  // vocab) logits never exist whole; more rows are fewer passes over the decoder's weight and
  // its gradient, at rows x vocab x 4 bytes.
  int logit_chunk_rows = 256;
  // Not a key: data.nsp, copied here by the loader (BERT's head then trains its pooler and
  // next-sentence classifier; they exist, and are saved, either way).
  bool nsp = false;
  // Not a key either: data.mask_prob, copied by the loader (BERT's head holds the logits of its
  // masked tokens only: labelled_per_sequence).
  float mask_prob = 0.15f;

  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  Vocab vocab = Vocab::Bert;   // bert | gpt2
  std::string train_file;      // token file (.bin, little-endian uint16)
  std::string valid_file;
  bool shuffle = true;
  float mask_prob = 0.15f;     // BERT MLM
  // BERT: next-sentence prediction beside MLM (NVIDIA's recipe): each sequence is a pair of text
  // segments from the corpus's documents, half of them consecutive (data/batches.hpp). Needs the
  // token file's document index (X.docs). Off by default: MLM alone, as every earlier result.
  bool nsp = false;
  uint64_t seed = 1234;

  bool operator==(const DataConfig&) const = default;
};

// SOAP's own keys (optim.soap.*; Vyas et al. 2024, the authors' soap.py): the decay of its
// statistics L = EMA(G G^T), R = EMA(G^T G), the steps between eigenbasis refreshes, and the
// largest side it rotates (a longer side, e.g. a vocabulary's, is left unrotated).
struct SoapConfig {
  double shampoo_beta = 0.95;
  int precondition_frequency = 10;
  int max_precond_dim = 10000;

  bool operator==(const SoapConfig&) const = default;
};

struct OptimConfig {
  OptimName name = OptimName::NvLamb;  // nvlamb | adamw | sgd | soap
  double lr = 1e-2;
  int warmup_steps = 10;
  // After the linear warm-up the rate decays from lr to min_lr (optim/lr_schedule.hpp): poly (the
  // BERT recipe's (1 - p)^decay_power, the paper's), linear, cosine, or constant (stays at lr).
  LrDecay schedule = LrDecay::Poly;
  double decay_power = 0.5;     // poly's power
  double min_lr = 0;            // the floor the decay reaches, in [0, lr]
  // Steps over which the rate decays to 0 (0 = train.steps). A resume with a smaller train.steps
  // keeps the checkpoint's schedule, a larger one decays over the new train.steps from the
  // checkpoint's step (train/checkpointing.hpp).
  int decay_steps = 0;
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
  double momentum = 0.9;        // sgd
  double grad_clip = 1.0;       // global-norm pre-normalisation (nvlamb) / clipping; 0 = off
  SoapConfig soap;

  bool operator==(const OptimConfig&) const = default;
};

struct TrainConfig {
  int steps = 80;
  uint64_t seed = 42;
  int threads = 0;              // 0 = all cores (divided among local ranks)
  bool deterministic = true;    // same seed + thread count => same bits
  int log_every = 1;
  int eval_every = 20;          // validation loss every K steps (0 = only at the end)
  int eval_batches = 4;
  std::string out_dir = "runs/default";
  std::string log_json;         // one JSON object per step
  std::string checkpoint_dir;   // empty: out_dir/checkpoints
  // Steps between checkpoints; one is also written after the last step and on a stop signal, so a
  // stopped or finished run continues (train/train_loop.hpp). 0 = no checkpoints at all.
  int checkpoint_every = 100;
  int keep_checkpoints = 2;     // the newest K complete checkpoints are kept (0 = all)
  OnNonfinite on_nonfinite = OnNonfinite::Skip;  // NaN/Inf loss or gradient: skip the step's update | stop the run

  bool operator==(const TrainConfig&) const = default;
};

// parallel.data_parallel = auto, as torchtitan and Megatron take it: the MPI world's size over
// the stages, known only once the run is launched (resolve_data_parallel).
inline constexpr int kAutoDataParallel = 0;

struct ParallelConfig {
  int stages = 1;
  int data_parallel = kAutoDataParallel;  // resolve_data_parallel() sets it before a run
  ScheduleName schedule = ScheduleName::OneFOneB;
  std::string schedule_file;
  int micro_batches = 4;        // per step per replica
  int micro_batch_size = 8;     // sequences per micro-batch
  int virtual_stages = 1;
  std::vector<int> partition;   // transformer blocks per stage; empty = balanced
  // Activation recomputation (the paper's R): a stage keeps only its input per micro-batch and
  // re-runs its forward just before that micro-batch's backward (runtime/executor.hpp).
  bool recompute = false;
  // T_b / T_f, one micro-batch's backward over its forward time on a stage: Chimera's, zb-auto's
  // and zb-v's orders are chosen for it (schedule/generators.hpp; zero-bubble: T_I = T_W = T_b / 2). The paper's 2 by default; a run's profile.json
  // gives the measured one.
  double backward_forward_ratio = 2;
  // zb-auto's memory limit, a multiple X of 1F1B's peak (schedule/zb_auto.hpp): 1 ZB-1p, 2 ZB-2p.
  double zb_memory = 1;

  bool operator==(const ParallelConfig&) const = default;
};

// The largest zb-auto memory limit X (parallel.zb_memory, plan's --zb-memory): beyond it the
// limit is refused; N micro-batches cap it anyway.
inline constexpr double kMaxZbMemory = 100;

// The longest refresh cycle a config may ask for (a plan lists every step of its cycle).
inline constexpr int kMaxRefreshSteps = 1000;

struct KfacConfig {
  bool enabled = false;
  double damping = 1e-3;        // gamma (pi-corrected Tikhonov)
  double ema = 0.0;             // factor EMA decay; 0 = factors from the latest step only
  double kl_clip = 0.0;         // 0 = off
  int inverse_every = 1;        // refresh interval for placement = inline/skip
  int diag_limit = 10000;       // layers with more outputs keep only diag(B)
  Placement placement = Placement::Bubbles;  // bubbles | adaptive | inline | skip | replay (unset with one stage and K-FAC on: inline)
  KfacStrategy distributed = KfacStrategy::SpdKfac;  // inline / skip, a stage with copies: d-kfac | mpd-kfac | spd-kfac
  bool spd_pipelining = true;   // spd-kfac: factor all-reduces overlapped with compute, fused (Table IV)
  bool spd_balance = true;      // spd-kfac: load-balanced inversion placement (Algorithm 1)
  int warmup_steps = -1;        // K-FAC's own warm-up; -1 = optim.warmup_steps
  // bubbles: re-profile and re-plan when step durations drift (timing-driven, so a run that
  // re-plans is not repeatable bit for bit; false keeps the first plan: runtime/units/chunk_kfac.hpp)
  bool replan_on_drift = true;
  // bubbles: true lets the planner split an inversion into diagonal blocks (a block-diagonal
  // factor) when that shortens a device's refresh period (plan/planner.hpp). Off by default: the
  // paper keeps exact factors and splits only an inversion larger than every bubble (its
  // appendix A.2), which happens either way.
  bool split_inversions = false;
  // bubbles, adaptive: the shortest refresh cycle a plan may have (steps): a device whose units fit
  // in fewer steps still refreshes only every this many (plan/planner.hpp: PlanInput).
  int min_refresh_steps = 1;
  // adaptive: the longest refresh cycle a re-plan from the measured steady state may choose; 0 =
  // the plan from the profile's (so a quiet run refreshes at least as often as `bubbles`).
  int max_refresh_steps = 0;
  // bubbles: plan from this recorded PipeFisher profile (the `pipefisher_plan` object of a run's
  // out_dir/kfac_profile.json, or of --profile-dir's profile.json) instead of this run's timings,
  // so every run of the same config refreshes the same way and gives the same losses. Empty =
  // profile online (the default). Set, it also turns re-planning on drift off.
  std::string plan_profile;
  // replay: the refresh record (out_dir/kfac_refresh.json of a bubbles run) that one process
  // follows, so it trains what that pipeline trained (kfac/refresh_record.hpp).
  std::string refresh_record;

  bool operator==(const KfacConfig&) const = default;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  ParallelConfig parallel;
  KfacConfig kfac;

  // Loads a TOML file (empty path = built-in defaults) and applies `key=value` overrides. Path
  // keys come out absolute: the file's relative ones against its directory, the overrides' and
  // the defaults' against the current one (config/paths.hpp); `--set model.preset=P` brings P's
  // sizes over the file's.
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  static Config from_toml_string(const std::string& text, const std::vector<std::string>& overrides = {});
  // Refuses values that cannot work, naming the key. Does not touch the file system.
  void validate() const;
  // Checks that data files named by the config exist, naming the key of the first that does not.
  void check_files() const;
  // Every key in declaration order, as config.toml and --print-config show it.
  std::string to_toml() const;
  bool operator==(const Config&) const = default;
};

// parallel.data_parallel = auto made a number: world_size / parallel.stages, refused naming both
// numbers when the stages do not divide the world; a number already set is kept. Validates again
// (a key such as kfac.placement = replay depends on it).
void resolve_data_parallel(Config& c, int world_size);

// Every key's dotted name ("model.preset", ..., "precond.refresh_record"), in declaration order (new names only).
std::vector<std::string> config_keys();

// Keys that moved keep their old names as aliases: [precond] (where and when K-FAC's or SOAP's
// periodic work runs) was kfac.placement, kfac.refresh_record, ... A config file or --set may use
// either name (both, with different values, is refused naming the two); config.toml writes the
// new one, and a saved one with the old names compares as the new (first_difference).
// The name a key has now: "kfac.placement" -> "precond.placement"; any other key as it is.
std::string current_key_name(const std::string& key);
// The old name of a key that has one ("precond.placement" -> "kfac.placement"), else "".
std::string old_key_name(const std::string& key);

// Every key with its type, default, allowed values and meaning, as markdown: what
// `pipefisher config --describe` prints and docs/config.md holds (config/describe.cpp).
std::string describe_config();

// The first key whose value differs between two texts in config.toml's layout ("[table]" lines,
// then "key = value" lines), in the order of `a`, then keys only `b` has, with both values
// ("(absent)" for a missing key); empty `key` when they agree. Keys are dotted ("train.steps") and
// current (an old name is read as its new one: current_key_name); those in `ignored` are not compared. Example: "[t]\nx = 1\n" and "[t]\nx = 2\n" differ at {"t.x", "1", "2"}.
struct KeyDifference {
  std::string key, a, b;
};
KeyDifference first_difference(const std::string& a, const std::string& b, const std::vector<std::string>& ignored = {});

// A float as the user wrote it: 0.15f -> 0.15 (its shortest decimal form, read as a double), not
// 0.15000000596046448. Files we write (config.toml, config.json) hold these.
double float_as_written(float f);
// The shortest text that reads back as exactly this double ("0.1", "1e-06", "2.0").
std::string shortest_double(double d);

// The preset whose shape (architecture, sizes, vocabulary, positions) `m` has, or "custom".
std::string preset_of(const ModelConfig& m);
// The optimizer as a banner says it: "nvlamb", "nvlamb + K-FAC (inline)", ... (with K-FAC's placement).
std::string optimizer_of(const Config& c);

// Which kfac.placement a run allows (asked of its spec, config/placement.hpp): the planned ones
// fill a pipeline's bubbles (parallel.stages > 1, under mpirun); `replay` follows a pipeline's
// record in one process; `inline` and `skip` run anywhere. UsageError naming kfac.placement
// otherwise (nothing without K-FAC).
enum class KfacRunner { one_process, mpi };
void check_kfac_placement(const Config& c, KfacRunner runner);
// K-FAC's placement when the key is unset: inline with one stage (no bubbles), bubbles otherwise.
Placement default_kfac_placement(int stages);

// Settings that work but are probably not what was meant (warm-up longer than the run, ...): one
// sentence each, naming the keys.
std::vector<std::string> config_warnings(const Config& c);

// Key/value heads (model.kv_heads, 0 until the loader fills it: model.heads) and their width, the
// keys (or values) of one token in one block: hidden for bert and gpt.
inline int kv_heads_of(const ModelConfig& m) { return m.kv_heads > 0 ? m.kv_heads : m.heads; }
inline int kv_width(const ModelConfig& m) { return kv_heads_of(m) * (m.hidden / m.heads); }

// The GELU a model computes: model.gelu, else its architecture's own (gpt: tanh, bert: erf).
Gelu gelu_of(const ModelConfig& m);

// The positions of a sequence whose token is predicted (labels >= 0): gpt every one; bert
// round(mask_prob * (T-2)), at least one; with NSP at most round(mask_prob * (T-3)) (a short pair
// has fewer). What the head's work, its logits, and so the model's FLOPs scale with.
int masked_per_sequence(int seq_len, float mask_prob);
int labelled_per_sequence(const ModelConfig& model, int seq_len);

// Fills model sizes for a named preset; throws UsageError("model.preset: ...") for an unknown one.
void apply_model_preset(ModelConfig& m, const std::string& preset);
std::vector<std::string> model_preset_names();

}  // namespace pf
