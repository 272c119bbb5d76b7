// `pipefisher eval`: validation loss and perplexity of saved weights on the held-out token file.
//   pipefisher eval --config configs/gpt2-tiny.toml --init runs/gpt2-tiny/model.safetensors
//   pipefisher eval --init runs/default/checkpoints --batches 0 --json
// The sequences are the trainer's validation ones (data.valid_file, never shuffled, BERT's masks
// drawn from data.seed), so with --batches = train.eval_batches (the default) the loss equals the
// one the training run logged for the same weights (with data.nsp: masked LM + next-sentence
// prediction). Perplexity is exp(language-model loss): for BERT the masked LM's, over the masked
// positions only.
#include "command.hpp"
#include "core/error.hpp"
#include "data/batches.hpp"
#include "model_flags.hpp"
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pf::app {
namespace {

struct EvalArgs {
  ModelFlags model;
  int batches = -1;  // -1 = train.eval_batches; 0 = every window of the file once
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  LoadedModel m = load_model(a.model, load_model_config(a.model, "eval"));
  const Config& cfg = m.cfg;
  std::unique_ptr<Batcher> valid = make_batcher(cfg.model, cfg.data, true);
  const int rows = cfg.parallel.micro_batch_size;
  int batches = a.batches < 0 ? cfg.train.eval_batches : a.batches;
  // Sequences past the split's end repeat it (in the same order, with the same masks).
  const int64_t held = valid->sequences_per_epoch();
  const int64_t most = std::clamp<int64_t>(held / rows, 1, std::numeric_limits<int>::max());
  if (a.batches > most)
    usage_error("--batches", "{} micro-batches of {} sequences are more than data.valid_file '{}' holds ({} sequences of {} tokens): "
                "at most {} (0 scores each of them once)", a.batches, rows, cfg.data.valid_file, held,
                cfg.model.seq_len, most);
  if (batches == 0) batches = static_cast<int>(most);
  ModelState st = m.model->make_state(rows, cfg.model.seq_len);
  MicroBatch mb;
  mb.resize(rows, cfg.model.seq_len);
  const EvalResult r = evaluate_model(*m.model, st, *valid, batches, rows, mb);
  const double ppl = std::exp(r.lm_loss);
  if (a.json) {
    nlohmann::json j{{"loss", r.loss},           {"lm_loss", r.lm_loss}, {"perplexity", ppl},
                     {"lm_loss_se", std::isfinite(r.lm_loss_se) ? nlohmann::json(r.lm_loss_se) : nlohmann::json()},
                     {"positions", r.positions}, {"sequences", r.sequences},
                     {"valid_file", cfg.data.valid_file}, {"init", a.model.init},
                     {"arch", cfg.model.arch}};
    fmt::print("{}\n", j.dump());
  } else {
    const std::string nsp = cfg.data.nsp ? fmt::format(" (masked LM {:.4f} + NSP)", r.lm_loss) : "";
    const std::string se = std::isfinite(r.lm_loss_se) ? fmt::format(", standard error {:.4f}", r.lm_loss_se) : "";
    fmt::print("eval: {} on {}: validation loss {:.4f}{}, perplexity {:.2f} ({} sequences of {}, {} {} scored{})\n",
               a.model.init, cfg.data.valid_file, r.loss, nsp, ppl, r.sequences, cfg.model.seq_len, r.positions,
               cfg.model.arch == Arch::Bert ? "masked tokens" : "tokens", se);
  }
  return 0;
}

Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<EvalArgs>();
  add_model_flags(cmd, a->model);
  cmd.add_option("--batches", a->batches,
                 "micro-batches of parallel.micro_batch_size held-out sequences to score (default: "
                 "train.eval_batches, as training does; 0 = every window of the file once)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--json", a->json, "print one JSON object (loss, perplexity, positions, sequences, ...)");
  return [a] { return run_eval(*a); };
}

}  // namespace

PF_COMMAND(eval, "eval", "Validation loss and perplexity of saved weights (--init) on data.valid_file", setup)

}  // namespace pf::app
