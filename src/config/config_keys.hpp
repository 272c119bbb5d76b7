#pragma once
// The configuration's keys, each declared once: its dotted name, its member and its bounds
// (the values validate() accepts and the sentence refusing the others). config.cpp reads,
// validates and prints (config.toml, --print-config) every key by walking these tables; a new
// key is one line here and a member in config.hpp. Internal to config.cpp.
#include "config/config.hpp"
#include "schedule/zb_auto.hpp"

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
  bool accepts(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
};
constexpr Bounds kAny{};
constexpr Bounds kPositive{0, kInf, true, false, "must be positive (got {})"};
constexpr Bounds kNonNegative{0, kInf, false, false, "must be >= 0 (got {})"};
constexpr Bounds kFraction{0, 1, false, true, "must be in [0, 1) (got {})"};
constexpr Bounds kNonEmpty{0, kInf, false, false, "must not be empty"};
constexpr Bounds kPath{.path = true};
constexpr Bounds kNonEmptyPath{0, kInf, false, false, "must not be empty", true};

// The keys, each declared once: its name, its member, its bounds. Reading, validating and
// printing (config.toml, --print-config) all walk these in this order. `key` is called as
// key("model.layers", m.layers, kPositive); C is a Config or a const Config.
template <typename C, typename F>
void model_keys(C& c, F& key) {
  auto& m = c.model;
  key("model.preset", m.preset, kAny);
  key("model.arch", m.arch, kAny);
  key("model.layers", m.layers, kPositive);
  key("model.hidden", m.hidden, kPositive);
  key("model.heads", m.heads, kPositive);
  key("model.ffn", m.ffn, kPositive);
  key("model.seq_len", m.seq_len, kAny);
  key("model.max_position", m.max_position, kPositive);
  key("model.vocab", m.vocab, kPositive);
  key("model.type_vocab", m.type_vocab, kPositive);
  key("model.dropout", m.dropout, kFraction);
  key("model.layer_norm_eps", m.layer_norm_eps, kPositive);
  key("model.init_std", m.init_std, kPositive);
  key("model.gelu", m.gelu, kAny);
}

template <typename C, typename F>
void data_keys(C& c, F& key) {
  auto& d = c.data;
  key("data.vocab", d.vocab, kAny);
  key("data.train_file", d.train_file, kPath);
  key("data.valid_file", d.valid_file, kPath);
  key("data.shuffle", d.shuffle, kAny);
  key("data.mask_prob", d.mask_prob, Bounds{0, 1, true, true, "must be in (0, 1) (got {})"});
  key("data.nsp", d.nsp, kAny);
  key("data.seed", d.seed, kAny);
}

template <typename C, typename F>
void optim_keys(C& c, F& key) {
  auto& o = c.optim;
  key("optim.name", o.name, kAny);
  key("optim.lr", o.lr, kPositive);
  key("optim.warmup_steps", o.warmup_steps, kNonNegative);
  key("optim.schedule", o.schedule, kAny);
  key("optim.decay_power", o.decay_power, kNonNegative);
  key("optim.min_lr", o.min_lr, kNonNegative);
  key("optim.decay_steps", o.decay_steps, kNonNegative);
  key("optim.weight_decay", o.weight_decay, kNonNegative);
  key("optim.beta1", o.beta1, kFraction);
  key("optim.beta2", o.beta2, kFraction);
  key("optim.eps", o.eps, kPositive);
  key("optim.momentum", o.momentum, kFraction);
  key("optim.grad_clip", o.grad_clip, kNonNegative);
}

template <typename C, typename F>
void train_keys(C& c, F& key) {
  auto& t = c.train;
  key("train.steps", t.steps, kPositive);
  key("train.seed", t.seed, kAny);
  key("train.threads", t.threads, kNonNegative);
  key("train.deterministic", t.deterministic, kAny);
  key("train.log_every", t.log_every, kPositive);
  key("train.eval_every", t.eval_every, kNonNegative);
  key("train.eval_batches", t.eval_batches, kPositive);
  key("train.out_dir", t.out_dir, kNonEmptyPath);
  key("train.log_json", t.log_json, kPath);
  key("train.checkpoint_dir", t.checkpoint_dir, kPath);
  key("train.checkpoint_every", t.checkpoint_every, kNonNegative);
  key("train.keep_checkpoints", t.keep_checkpoints, kNonNegative);
  key("train.on_nonfinite", t.on_nonfinite, Bounds{.refusal = "must be 'skip' or 'stop' (got '{}')"});
}

template <typename C, typename F>
void parallel_keys(C& c, F& key) {
  auto& p = c.parallel;
  key("parallel.stages", p.stages, kPositive);
  key("parallel.data_parallel", p.data_parallel, kPositive);
  key("parallel.schedule", p.schedule, kAny);
  key("parallel.schedule_file", p.schedule_file, kPath);
  key("parallel.micro_batches", p.micro_batches, kPositive);
  key("parallel.micro_batch_size", p.micro_batch_size, kPositive);
  key("parallel.virtual_stages", p.virtual_stages, kPositive);
  key("parallel.partition", p.partition, kAny);
  key("parallel.recompute", p.recompute, kAny);
  // Beyond 1e3 (or below 1e-3) one of the two is free next to the other; the order is then settled.
  key("parallel.backward_forward_ratio", p.backward_forward_ratio,
      Bounds{1e-3, 1e3, false, false, "must be between 0.001 and 1000 (got {})"});
  static_assert(kMaxZbMemory == 100, "the refusal below names the bound");
  key("parallel.zb_memory", p.zb_memory,
      Bounds{0, kMaxZbMemory, true, false, "must be a multiple of 1F1B's peak memory in (0, 100] (got {})"});
}

template <typename C, typename F>
void kfac_keys(C& c, F& key) {
  auto& k = c.kfac;
  key("kfac.enabled", k.enabled, kAny);
  key("kfac.damping", k.damping, kPositive);
  key("kfac.ema", k.ema, kFraction);
  key("kfac.kl_clip", k.kl_clip, kNonNegative);
  key("kfac.inverse_every", k.inverse_every, kPositive);
  key("kfac.diag_limit", k.diag_limit, kPositive);
  key("kfac.placement", k.placement, kAny);
  key("kfac.distributed", k.distributed, kAny);
  key("kfac.spd_pipelining", k.spd_pipelining, kAny);
  key("kfac.spd_balance", k.spd_balance, kAny);
  key("kfac.warmup_steps", k.warmup_steps,
      Bounds{-1, kInf, false, false, "must be >= 0, or -1 for optim.warmup_steps (got {})"});
  key("kfac.replan_on_drift", k.replan_on_drift, kAny);
  key("kfac.split_inversions", k.split_inversions, kAny);
  key("kfac.plan_profile", k.plan_profile, kPath);
  key("kfac.refresh_record", k.refresh_record, kPath);
}

template <typename C, typename F>
void for_each_key(C& c, F&& key) {
  model_keys(c, key);
  data_keys(c, key);
  optim_keys(c, key);
  train_keys(c, key);
  parallel_keys(c, key);
  kfac_keys(c, key);
}

}  // namespace pf::key_table
