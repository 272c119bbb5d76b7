// `pipefisher eval`: validation loss and perplexity of saved weights on the held-out token file.
//   pipefisher eval --config configs/gpt2-tiny.toml --init runs/gpt2-tiny/model.safetensors
//   pipefisher eval --init runs/default/checkpoints --batches 0 --json
//   pipefisher eval --init runs/kfac --baseline runs/nvlamb --batches 0   # a paired difference
// The sequences are the trainer's validation ones (data.valid_file, never shuffled, BERT's masks
// drawn from data.seed), so with --batches = train.eval_batches (the default) the loss equals the
// one the training run logged for the same weights (with data.nsp: masked LM + next-sentence
// prediction). Perplexity is exp(language-model loss): for BERT the masked LM's, over the masked
// positions only.
#include "command.hpp"
#include "core/error.hpp"
#include "core/progress.hpp"
#include "data/batches.hpp"
#include "model_flags.hpp"
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pf::app {
namespace {

struct EvalArgs {
  ModelFlags model;
  std::string baseline;  // other weights scored on the same sequences; "" = none
  int batches = -1;      // -1 = train.eval_batches; 0 = every window of the file once
  bool json = false;
  bool per_batch = false;  // --json also lists each micro-batch's share of lm_loss and its positions
};

// --batches, else train.eval_batches; 0 = every window of the file once.
int batches_to_score(const EvalArgs& a, const Config& cfg, const Batcher& valid) {
  const int rows = cfg.parallel.micro_batch_size;
  // Sequences past the split's end repeat it (in the same order, with the same masks).
  const int64_t held = valid.sequences_per_epoch();
  const int64_t most = std::clamp<int64_t>(held / rows, 1, std::numeric_limits<int>::max());
  if (a.batches > most)
    usage_error("--batches", "{} micro-batches of {} sequences are more than data.valid_file '{}' holds ({} sequences of {} tokens): "
                "at most {} (0 scores each of them once)", a.batches, rows, cfg.data.valid_file, held,
                cfg.model.seq_len, most);
  if (a.batches < 0) check_eval_batches(cfg, valid);
  const int batches = a.batches < 0 ? cfg.train.eval_batches : a.batches;
  return batches == 0 ? static_cast<int>(most) : batches;
}

// `model` on the held-out sequences `cfg` names (data.valid_file, micro-batch size, masks), with
// a status line on a terminal ("eval --init 12/40 | 0:03 elapsed, ETA 0:07").
EvalResult score(Model& model, const Config& cfg, int batches, const std::string& which) {
  std::unique_ptr<Batcher> valid = make_batcher(cfg.model, cfg.data, true);
  const int rows = cfg.parallel.micro_batch_size;
  ModelState st = model.make_state(rows, cfg.model.seq_len);
  MicroBatch mb;
  mb.resize(rows, cfg.model.seq_len);
  std::unique_ptr<ProgressLine> line;
  return evaluate_model(model, st, *valid, batches, rows, mb, [&](int done, int total) {
    if (!line) line = std::make_unique<ProgressLine>("eval " + which + " micro-batch", total);
    line->update(done);
  });
}

// The baseline's weights, configured as --init's are (--config, else its run's config.toml, with
// the same --set); its errors name --baseline. It must read --init's sequences.
LoadedModel load_baseline(const EvalArgs& a, const Config& cfg) {
  ModelFlags b = a.model;
  b.init = a.baseline;
  try {
    LoadedModel m = load_model(b, load_model_config(b, "eval"));
    const ModelConfig &mine = cfg.model, &theirs = m.cfg.model;
    if (theirs.arch != mine.arch || theirs.vocab != mine.vocab || theirs.seq_len != mine.seq_len)
      usage_error("--baseline", "'{}' is a {} model of vocabulary {} on sequences of {}: it cannot be scored on --init's "
                  "({} of vocabulary {} on sequences of {})", a.baseline, theirs.arch, theirs.vocab, theirs.seq_len,
                  mine.arch, mine.vocab, mine.seq_len);
    return m;
  } catch (const UsageError& e) {
    std::string message = e.what();
    if (message.rfind("--init", 0) == 0) message.replace(0, 6, "--baseline");
    throw UsageError(message);
  }
}

// --init's LM loss minus the baseline's on the same micro-batches, and the standard error of that
// difference: paired, so the sequences' own difficulty cancels (batch_mean_standard_error of
// the micro-batches' differences).
struct Paired {
  double lm_loss = 0, diff = 0, diff_se = 0;
};
Paired paired_with(const EvalResult& mine, const EvalResult& base) {
  PF_CHECK(mine.batch_positions == base.batch_positions, "the baseline was scored on other sequences");
  std::vector<double> d(mine.lm_shares.size());
  for (size_t b = 0; b < d.size(); ++b) d[b] = mine.lm_shares[b] - base.lm_shares[b];
  return {base.lm_loss, mine.lm_loss - base.lm_loss, batch_mean_standard_error(d, mine.batch_positions)};
}

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

void print_json(const EvalArgs& a, const Config& cfg, const EvalResult& r, const std::optional<Paired>& p) {
  nlohmann::json j{{"loss", r.loss},           {"lm_loss", r.lm_loss}, {"perplexity", std::exp(r.lm_loss)},
                   {"lm_loss_se", finite_or_null(r.lm_loss_se)},
                   {"positions", r.positions}, {"sequences", r.sequences},
                   {"valid_file", cfg.data.valid_file}, {"init", a.model.init},
                   {"arch", cfg.model.arch}};
  if (a.per_batch) {
    j["lm_shares"] = r.lm_shares;
    j["batch_positions"] = r.batch_positions;
  }
  if (p) {
    j["baseline"] = a.baseline;
    j["baseline_lm_loss"] = p->lm_loss;
    j["lm_loss_diff"] = p->diff;
    j["lm_loss_diff_se"] = finite_or_null(p->diff_se);
  }
  fmt::print("{}\n", j.dump());
}

void print_text(const EvalArgs& a, const Config& cfg, const EvalResult& r, const std::optional<Paired>& p) {
  const std::string nsp = cfg.data.nsp ? fmt::format(" (masked LM {:.4f} + NSP)", r.lm_loss) : "";
  const std::string se = std::isfinite(r.lm_loss_se) ? fmt::format(", standard error {:.4f}", r.lm_loss_se) : "";
  fmt::print("eval: {} on {}: validation loss {:.4f}{}, perplexity {:.2f} ({} sequences of {}, {} {} scored{})\n",
             a.model.init, cfg.data.valid_file, r.loss, nsp, std::exp(r.lm_loss), r.sequences, cfg.model.seq_len,
             r.positions, cfg.model.arch == Arch::Bert ? "masked tokens" : "tokens", se);
  if (!p) return;
  const std::string diff_se = std::isfinite(p->diff_se) ? fmt::format(", paired standard error {:.4f}", p->diff_se) : "";
  fmt::print("eval: against {}: its LM loss {:.4f}, difference {:+.4f}{}\n", a.baseline, p->lm_loss, p->diff, diff_se);
}

int run_eval(const EvalArgs& a) {
  if (a.per_batch && !a.json) usage_error("--per-batch", "lists the micro-batches in the JSON object: give --json too");
  LoadedModel m = load_model(a.model, load_model_config(a.model, "eval"));
  const Config& cfg = m.cfg;
  const int batches = batches_to_score(a, cfg, *make_batcher(cfg.model, cfg.data, true));
  std::optional<LoadedModel> base;
  if (!a.baseline.empty()) base = load_baseline(a, cfg);  // refused before any scoring
  const EvalResult r = score(*m.model, cfg, batches, "--init");
  std::optional<Paired> p;
  if (base) p = paired_with(r, score(*base->model, cfg, batches, "--baseline"));
  if (a.json)
    print_json(a, cfg, r, p);
  else
    print_text(a, cfg, r, p);
  // A diverged model (weights that overflow the forward) scores no loss: not a result.
  if (!std::isfinite(r.loss) || !std::isfinite(r.lm_loss)) {
    std::fprintf(stderr, "eval: the loss of %s is not finite: its weights do not make a working model\n",
                 a.model.init.c_str());
    return 1;
  }
  return 0;
}

Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<EvalArgs>();
  add_model_flags(cmd, a->model);
  cmd.add_option("--batches", a->batches,
                 "micro-batches of parallel.micro_batch_size held-out sequences to score (default: "
                 "train.eval_batches, as training does; 0 = every window of the file once)")
      ->check(pf::app::kNonNegativeInteger);
  cmd.add_option("--baseline", a->baseline,
                 "other weights (as --init), scored on the same sequences: prints the LM loss difference and its "
                 "paired standard error");
  cmd.add_flag("--json", a->json, "print one JSON object (loss, perplexity, positions, sequences, ...)");
  cmd.add_flag("--per-batch", a->per_batch,
               "with --json: also each micro-batch's share of lm_loss (lm_shares) and the positions it scores "
               "(batch_positions), for paired comparisons of runs later");
  return [a] { return run_eval(*a); };
}

}  // namespace

PF_COMMAND(eval, "eval", "Validation loss and perplexity of saved weights (--init) on data.valid_file", setup)

}  // namespace pf::app
