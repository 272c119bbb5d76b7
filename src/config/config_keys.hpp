#pragma once
// The configuration's keys, each declared once: its dotted name, its member and its bounds
// (the values validate() accepts and the sentence refusing the others) and one line of meaning.
// config.cpp reads and prints (config.toml, --print-config), validate.cpp validates and
// describe.cpp describes every key by walking these tables; a new key is one line here and a
// member in config.hpp. Internal to the config module (config.cpp, validate.cpp, describe.cpp).
#include "config/config.hpp"

#include <limits>

namespace pf::key_table {

// The values validate() accepts for a number (or, with a string, "not empty"), and the sentence
// refusing the others, with the value as {}. For a setting (an enum), `refusal` replaces the
// usual "'x' is not one of a, b" and gets the text that was written.
constexpr double kInf = std::numeric_limits<double>::infinity();
struct Bounds {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  const char* refusal = nullptr;  // nullptr: any value
  // A file or directory: relative in a config file, against the file's directory; on the command
  // line (--set) or from the defaults, against the current directory. Held absolute after loading.
  bool path = false;
  // An integer that may also be the word "auto", held as 0 (parallel.data_parallel).
  bool auto_word = false;
  bool accepts(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
};
constexpr Bounds kAny{};
constexpr Bounds kPositive{0, kInf, true, false, "must be positive (got {})"};
constexpr Bounds kNonNegative{0, kInf, false, false, "must be >= 0 (got {})"};
constexpr Bounds kFraction{0, 1, false, true, "must be in [0, 1) (got {})"};
constexpr Bounds kNonEmpty{0, kInf, false, false, "must not be empty"};
constexpr Bounds kPath{.path = true};
constexpr Bounds kPositiveOrAuto{0, kInf, true, false, "must be a positive integer or 'auto' (got {})", false, true};
constexpr Bounds kNonEmptyPath{0, kInf, false, false, "must not be empty", true};
constexpr Bounds kLogitChunkRows{1, 1 << 20, false, false, "must be from 1 to 1048576 (got {})"};

// The keys, each declared once: its name, its member, its bounds and one line of meaning.
// Reading, validating, printing (config.toml, --print-config) and describing (config --describe,
// docs/config.md) all walk these in this order. `key` is called as
// key("model.layers", m.layers, kPositive, "transformer blocks"); C is a Config or a const Config.
template <typename C, typename F>
void model_keys(C& c, F& key) {
  auto& m = c.model;
  key("model.preset", m.preset, kAny,
      "a named shape (bert-tiny ... bert-large, gpt2-tiny ... gpt2-medium, llama-tiny, llama-mini) that sets the sizes below; empty: the keys' own values");
  key("model.arch", m.arch, kAny,
      "bert: post-LN encoder with a masked-LM head; gpt: pre-LN decoder with a causal-LM head; llama: RMSNorm, rotary positions, SwiGLU, no biases, causal-LM head");
  key("model.layers", m.layers, kPositive, "transformer blocks");
  key("model.hidden", m.hidden, kPositive, "hidden size h");
  key("model.heads", m.heads, kPositive, "attention heads (model.hidden must divide by it)");
  key("model.kv_heads", m.kv_heads, kPositiveOrAuto,
      "llama: key/value heads, grouped-query attention (model.heads must divide by it); auto: model.heads (bert, gpt: always)");
  key("model.ffn", m.ffn, kPositive, "feed-forward inner size f");
  key("model.seq_len", m.seq_len, kAny, "tokens per sequence s");
  key("model.max_position", m.max_position, kPositive, "rows of the position-embedding table (at least model.seq_len)");
  key("model.vocab", m.vocab, kPositive, "rows of the word-embedding table (at least the tokenizer's vocabulary)");
  key("model.type_vocab", m.type_vocab, kPositive, "BERT token types (segments)");
  key("model.dropout", m.dropout, kFraction, "dropout probability (every dropout but the attention probabilities'; 0: off)");
  key("model.layer_norm_eps", m.layer_norm_eps, kPositive, "epsilon of every layer norm (llama: of every RMSNorm)");
  key("model.rope_theta", m.rope_theta, kPositive, "llama: base of the rotary position embedding's frequencies");
  key("model.tie_embeddings", m.tie_embeddings, kAny,
      "the LM head uses the word embedding's matrix (bert, gpt: always; llama: false gives it lm_head.weight)");
  key("model.init_std", m.init_std, kPositive, "standard deviation of the initial weights");
  key("model.gelu", m.gelu, kAny, "GELU form: erf (BERT) or tanh (GPT-2); empty: the architecture's own");
  key("model.logit_chunk_rows", m.logit_chunk_rows, kLogitChunkRows,
      "labelled rows whose logits the LM head holds at once (rows x vocab x 4 bytes): more is faster, fewer is less memory");
}

template <typename C, typename F>
void data_keys(C& c, F& key) {
  auto& d = c.data;
  key("data.vocab", d.vocab, kAny, "tokenizer of the token files: bert (WordPiece) or gpt2 (byte-level BPE)");
  key("data.train_file", d.train_file, kPath,
      "training token file (.bin, uint16 ids; scripts/prepare-data.sh); empty: the fetched corpus's training split");
  key("data.valid_file", d.valid_file, kPath, "held-out token file; empty: the fetched corpus's held-out split");
  key("data.shuffle", d.shuffle, kAny, "visit the training windows in a new permutation every epoch");
  key("data.mask_prob", d.mask_prob, Bounds{0, 1, true, true, "must be in (0, 1) (got {})"},
      "BERT: share of the tokens selected for the masked LM");
  key("data.nsp", d.nsp, kAny,
      "BERT: train next-sentence prediction beside the masked LM (needs the token file's .docs index)");
  key("data.seed", d.seed, kAny, "seed of the data order and of BERT's masks");
}

template <typename C, typename F>
void optim_keys(C& c, F& key) {
  auto& o = c.optim;
  key("optim.name", o.name, kAny,
      "optimizer: nvlamb (the paper's baseline), adamw, sgd (momentum) or soap (Shampoo's eigenbasis with Adam in it, "
      "docs/optimizers.md)");
  key("optim.lr", o.lr, kPositive, "peak learning rate");
  key("optim.warmup_steps", o.warmup_steps, kNonNegative, "steps of linear warm-up from 0 to optim.lr");
  key("optim.schedule", o.schedule, kAny, "decay after the warm-up: poly (the paper's), linear, cosine or constant");
  key("optim.decay_power", o.decay_power, kNonNegative, "poly's power p of (1 - progress)^p");
  key("optim.min_lr", o.min_lr, kNonNegative, "the rate the decay ends at (at most optim.lr)");
  key("optim.decay_steps", o.decay_steps, kNonNegative, "steps over which the rate decays (0: train.steps)");
  key("optim.weight_decay", o.weight_decay, kNonNegative, "decoupled weight decay (not on biases and layer norms)");
  key("optim.beta1", o.beta1, kFraction, "first-moment decay (nvlamb, adamw, soap)");
  key("optim.beta2", o.beta2, kFraction, "second-moment decay (nvlamb, adamw, soap)");
  key("optim.eps", o.eps, kPositive, "denominator epsilon (nvlamb, adamw, soap)");
  key("optim.momentum", o.momentum, kFraction, "sgd's momentum");
  key("optim.grad_clip", o.grad_clip, kNonNegative,
      "global gradient norm the step is clipped (adamw, sgd, soap) or pre-normalised (nvlamb) to; 0: off");
  key("optim.soap.shampoo_beta", o.soap.shampoo_beta, kFraction,
      "soap: decay of the statistics L = EMA(G G^T) and R = EMA(G^T G) of each Linear's weight gradient G");
  key("optim.soap.precondition_frequency", o.soap.precondition_frequency, kPositive,
      "soap: steps between refreshes of the eigenbases Q_L, Q_R (one power iteration with QR; the first is an "
      "eigendecomposition)");
  key("optim.soap.max_precond_dim", o.soap.max_precond_dim, kPositive,
      "soap: a side of a weight longer than this is not rotated (one-sided rotation; neither side: Adam)");
}

template <typename C, typename F>
void train_keys(C& c, F& key) {
  auto& t = c.train;
  key("train.steps", t.steps, kPositive, "optimizer steps of the run");
  key("train.seed", t.seed, kAny, "seed of the initial weights and of dropout");
  key("train.threads", t.threads, kNonNegative,
      "threads per process (0: all cores, divided among the ranks of a host)");
  key("train.deterministic", t.deterministic, kAny,
      "same seed, layout and threads give the same bits (fixed reduction orders)");
  key("train.log_every", t.log_every, kPositive, "steps between printed lines when the output is not a terminal");
  key("train.eval_every", t.eval_every, kNonNegative, "steps between validation losses (0: only after the last step)");
  key("train.eval_batches", t.eval_batches, kPositive, "held-out micro-batches each validation scores");
  key("train.out_dir", t.out_dir, kNonEmptyPath,
      "the run directory: config.toml, logs, weights, summary, checkpoints/");
  key("train.log_json", t.log_json, kPath, "also write the step records (JSON lines) to this file");
  key("train.checkpoint_dir", t.checkpoint_dir, kPath, "where checkpoints go (empty: train.out_dir/checkpoints)");
  key("train.checkpoint_every", t.checkpoint_every, kNonNegative,
      "steps between checkpoints, also after the last step and on a stop signal (0: none)");
  key("train.keep_checkpoints", t.keep_checkpoints, kNonNegative, "the newest complete checkpoints kept (0: all)");
  key("train.on_nonfinite", t.on_nonfinite, Bounds{.refusal = "must be 'skip' or 'stop' (got '{}')"},
      "a step with a NaN or Inf loss or gradient: skip its update, or stop the run");
}

template <typename C, typename F>
void parallel_keys(C& c, F& key) {
  auto& p = c.parallel;
  key("parallel.stages", p.stages, kPositive, "pipeline stages (ranks per pipeline)");
  key("parallel.data_parallel", p.data_parallel, kPositiveOrAuto,
      "replicas of the pipeline (data parallelism); auto: the MPI world's size over parallel.stages");
  key("parallel.schedule", p.schedule, kAny,
      "pipeline schedule: naive, gpipe, 1f1b, interleaved, chimera, zb-h1, zb-h2, zb-auto or zb-v");
  key("parallel.schedule_file", p.schedule_file, kPath,
      "read the schedule from this file (plan --csv's form) instead of generating it");
  key("parallel.micro_batches", p.micro_batches, kPositive, "micro-batches per step per replica");
  key("parallel.micro_batch_size", p.micro_batch_size, kPositive, "sequences per micro-batch");
  key("parallel.virtual_stages", p.virtual_stages, kPositive, "model chunks per rank (interleaved)");
  key("parallel.partition", p.partition, kAny, "transformer blocks per stage, e.g. [3, 5] (empty: balanced)");
  key("parallel.recompute", p.recompute, kAny,
      "activation recomputation: keep each stage's input only and repeat its forward before the backward");
  // Beyond 1e3 (or below 1e-3) one of the two is free next to the other; the order is then settled.
  key("parallel.backward_forward_ratio", p.backward_forward_ratio,
      Bounds{1e-3, 1e3, false, false, "must be between 0.001 and 1000 (got {})"},
      "T_b / T_f the Chimera, zb-auto and zb-v orders are chosen for");
  static_assert(kMaxZbMemory == 100, "the refusal below names the bound");
  key("parallel.zb_memory", p.zb_memory,
      Bounds{0, kMaxZbMemory, true, false, "must be a multiple of 1F1B's peak memory in (0, 100] (got {})"},
      "zb-auto's memory limit as a multiple of 1F1B's peak (1: ZB-1p, 2: ZB-2p)");
}

template <typename C, typename F>
void kfac_keys(C& c, F& key) {
  auto& k = c.kfac;
  key("kfac.enabled", k.enabled, kAny, "precondition with K-FAC on top of optim.name");
  key("kfac.damping", k.damping, kPositive, "Tikhonov damping gamma (pi-corrected between the two factors)");
  key("kfac.ema", k.ema, kFraction, "decay of the factors' moving average (0: each refresh's factors alone)");
  key("kfac.kl_clip", k.kl_clip, kNonNegative, "KL clip of the preconditioned step (0: off)");
  key("kfac.inverse_every", k.inverse_every, kPositive, "steps between refreshes (placement inline or skip)");
  key("kfac.diag_limit", k.diag_limit, kPositive, "a layer with more outputs keeps only the diagonal of its B factor");
  key("kfac.distributed", k.distributed, kAny, "a stage with copies shares K-FAC work as d-kfac, mpd-kfac or spd-kfac");
  key("kfac.spd_pipelining", k.spd_pipelining, kAny, "spd-kfac: fused factor all-reduces overlapped with the backward");
  key("kfac.spd_balance", k.spd_balance, kAny, "spd-kfac: load-balanced placement of the inversions");
  key("kfac.warmup_steps", k.warmup_steps,
      Bounds{-1, kInf, false, false, "must be >= 0, or -1 for optim.warmup_steps (got {})"},
      "K-FAC's own learning-rate warm-up (-1: optim.warmup_steps)");
  key("kfac.split_inversions", k.split_inversions, kAny,
      "bubbles, adaptive: let the planner split an inversion into diagonal blocks when that shortens a refresh");
}

// Where and when a preconditioner's periodic work runs, K-FAC's or SOAP's (optim.name = soap): the
// members are KfacConfig's, the keys were kfac.* once and those names still read as these
// (key_aliases.cpp).
template <typename C, typename F>
void precond_keys(C& c, F& key) {
  auto& k = c.kfac;
  key("precond.placement", k.placement, kAny,
      "where K-FAC's work runs: bubbles (PipeFisher), adaptive (PipeFisher's plan, units placed in the waits at run "
      "time), inline, skip (every kfac.inverse_every steps) or replay; with optim.name = soap (kfac.enabled = false) "
      "where SOAP's eigenbasis refreshes run: inline (its optimizer step, the default), skip (the same, its "
      "statistics only on the refresh steps), bubbles or replay");
  key("precond.replan_on_drift", k.replan_on_drift, kAny, "bubbles, adaptive: re-profile and re-plan when step times drift");
  static_assert(kMaxRefreshSteps == 1000, "the refusals below name the bound");
  key("precond.min_refresh_steps", k.min_refresh_steps,
      Bounds{1, kMaxRefreshSteps, false, false, "must be between 1 and 1000 (got {})"},
      "bubbles, adaptive: the shortest refresh cycle (steps) a plan may have, however generous the bubbles");
  key("precond.max_refresh_steps", k.max_refresh_steps,
      Bounds{0, kMaxRefreshSteps, false, false, "must be between 0 (the profiled plan's) and 1000 (got {})"},
      "adaptive: the longest refresh cycle (steps) a re-plan from the measured steps may choose (0: the profiled "
      "plan's)");
  key("precond.plan_profile", k.plan_profile, kPath,
      "bubbles, adaptive: plan from this recorded profile (a run's kfac_profile.json, or with optim.name = soap its soap_profile.json) instead of this run's timings");
  key("precond.refresh_record", k.refresh_record, kPath,
      "replay: the refresh record (a pipeline run's kfac_refresh.json, or with SOAP its soap_refresh.json) to follow");
}

template <typename C, typename F>
void for_each_key(C& c, F&& key) {
  model_keys(c, key);
  data_keys(c, key);
  optim_keys(c, key);
  train_keys(c, key);
  parallel_keys(c, key);
  kfac_keys(c, key);
  precond_keys(c, key);
}

}  // namespace pf::key_table
