// `pipefisher generate`: text from a trained GPT model, through the GPT-2 tokenizer.
//   pipefisher generate --config configs/gpt2-tiny.toml --init runs/gpt2-tiny/model.safetensors
//       --prompt "Call me Ishmael." --max-new-tokens 40 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 1
// --temperature 0 is greedy decoding. Generation stops early after <|endoftext|>. The text is printed
// as each token comes; Ctrl-C stops there, keeps what was printed and exits 130. With --json, one
// object at the end: the prompt's ids, the new ids and their text, bytes that are no UTF-8 as
// U+FFFD, and under "timings" the generation's seconds and new tokens per second, the only part
// that differs between two runs of one command (train/generate.hpp says how tokens are drawn).
#include "command.hpp"
#include "core/error.hpp"
#include "core/signals.hpp"
#include "data/tokenizer.hpp"
#include "model_flags.hpp"
#include "train/generate.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <span>
#include <string>
#include <cstdio>

namespace pf::app {
namespace {

constexpr int32_t kEndOfText = 50256;  // GPT-2's <|endoftext|>

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int sig) { g_interrupted = sig; }

struct GenerateArgs {
  ModelFlags model;
  std::string prompt;
  std::string vocab_dir;  // "": found beside the token files or in the project's data (find_vocab_dir)
  int max_new_tokens = 32;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  bool json = false;
  bool no_kv_cache = false;
};

int run_generate(const GenerateArgs& a) {
  if (!(a.temperature >= 0) || !std::isfinite(a.temperature))
    usage_error("--temperature", "must be a finite number >= 0 (0 = greedy), got {}", a.temperature);
  if (!(a.top_p > 0 && a.top_p <= 1)) usage_error("--top-p", "must be in (0, 1] (1 = all tokens), got {}", a.top_p);
  const Config cfg = load_model_config(a.model, "generate");
  if (!causal_lm(cfg.model.arch)) usage_error("model.arch", "generate needs a causal LM (gpt, llama); {} is a masked LM", cfg.model.arch);
  const std::string vocab = a.vocab_dir.empty() ? find_vocab_dir("gpt2", cfg.data.valid_file) : a.vocab_dir;
  auto tok = load_tokenizer("gpt2", vocab);
  LoadedModel m = load_model(a.model, cfg);
  std::vector<int32_t> prompt = tok->encode(a.prompt);
  if (prompt.empty()) prompt.push_back(kEndOfText);  // as GPT-2 itself starts unconditional text
  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.sample = {a.temperature, a.top_k, a.top_p, a.seed};
  o.stop_token = kEndOfText;
  o.kv_cache = !a.no_kv_cache;
  o.vocab = tok->vocab_size();
  // The text streams: the prompt, then each token's bytes as it comes (a character split between
  // two byte-level tokens is whole once both are out, as a terminal shows it).
  if (!a.json) {
    std::fputs(a.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  o.on_token = [&](int32_t id) {
    if (!a.json) {
      const std::string bytes = tok->decode(std::span<const int32_t>(&id, 1));
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
      std::fflush(stdout);
    }
    return g_interrupted == 0;
  };
  catch_stop_signals(on_interrupt, {SIGINT, SIGTERM});  // the generation ends after the token being computed
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = generate(*m.model, prompt, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.json) {
    nlohmann::json j{{"prompt", a.prompt}, {"prompt_ids", prompt}, {"ids", ids}, {"text", tok->decode(ids)},
                     {"timings", {{"seconds", seconds},
                                  {"new_tokens_per_s", seconds > 0 ? static_cast<double>(ids.size()) / seconds : 0.0}}}};
    // Byte-level tokens may cut a character in two (the last one always may): JSON holds UTF-8
    // only, so such bytes print as U+FFFD; the ids keep them exactly.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    std::fputs("\n", stdout);
  }
  std::fflush(stdout);
  if (g_interrupted) {
    std::fprintf(stderr, "pipefisher generate: %s after %zu new tokens\n", g_interrupted == SIGINT ? "SIGINT" : "SIGTERM",
                 ids.size());
    return 128 + g_interrupted;  // as a shell reports a process the signal stopped: 130 for Ctrl-C
  }
  return 0;
}

Runner setup(CLI::App& cmd) {
  auto a = std::make_shared<GenerateArgs>();
  add_model_flags(cmd, a->model);
  cmd.add_option("--prompt", a->prompt, "the text to continue (empty: start from <|endoftext|>)");
  cmd.add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate")->check(pf::app::kNonNegativeInteger)
      ->capture_default_str();
  cmd.add_option("--temperature", a->temperature, "softmax temperature; 0 = greedy (argmax)")->capture_default_str();
  cmd.add_option("--top-k", a->top_k, "sample among the K most likely tokens only (0 = all)")
      ->check(pf::app::kNonNegativeInteger)
      ->capture_default_str();
  cmd.add_option("--top-p", a->top_p,
                 "sample among the most likely tokens whose probabilities first sum to P (nucleus; 1 = all)")
      ->capture_default_str();
  cmd.add_option("--seed", a->seed, "random seed of the sampling")->capture_default_str();
  cmd.add_option("--vocab-dir", a->vocab_dir,
                 "directory with the GPT-2 vocabulary files (default: beside data.valid_file's directory, "
                 "data/vocab, or the data/vocab of the program's source tree)");
  cmd.add_flag("--no-kv-cache", a->no_kv_cache,
               "recompute every token's whole context instead of keeping the keys and values (slower; the same "
               "tokens to float32 rounding)");
  cmd.add_flag("--json", a->json,
               "print one JSON object: prompt, prompt_ids, ids (the new tokens), text, timings (seconds, "
               "new_tokens_per_s)");
  return [a] { return run_generate(*a); };
}

}  // namespace

PF_COMMAND(generate, "generate", "Continue a prompt with a trained GPT model (--init)", setup)

}  // namespace pf::app
