// `pipefisher eval` and `pipefisher generate` on weights a Trainer wrote in this process:
// eval's loss is the trainer's evaluate() on the same weights; generate is a pure function of its
// seed, and greedy decoding picks the argmax of logits computed here from the weights file itself.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"
#include "../support/weights.hpp"
#include "io/safetensors.hpp"
#include "nn/model.hpp"
#include "train/generate.hpp"
#include "train/trainer.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using pf_test::run;

namespace {

std::string sample(const std::string& vocab) {
  return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20." + vocab + ".bin";
}

// A small model of `arch` on the committed sample (train and validation), one thread.
std::vector<std::string> tiny_sets(const std::string& arch) {
  const std::string vocab = arch == "bert" ? "bert" : "gpt2";
  return {"model.arch=" + arch, "model.layers=2", "model.hidden=32", "model.heads=2", "model.ffn=64",
          "model.seq_len=16", "data.train_file=" + sample(vocab), "data.valid_file=" + sample(vocab),
          "parallel.micro_batches=1", "parallel.micro_batch_size=4", "train.eval_batches=3", "train.threads=1",
          "optim.lr=1e-2", "optim.warmup_steps=0", "train.steps=3"};
}

std::string set_flags(const std::vector<std::string>& sets) {
  std::string s;
  for (const auto& kv : sets) s += " --set " + kv;
  return s;
}

// Trains `steps` steps in this process, saves the weights, returns the trainer's validation loss.
double train_and_save(const std::vector<std::string>& sets, const fs::path& weights, int steps) {
  pf::Trainer t(pf::Config::from_toml_string("", sets));
  for (int s = 0; s < steps; ++s) t.step();
  const std::vector<pf::Param*> mine = t.model().params();
  const std::vector<const pf::Param*> ps(mine.begin(), mine.end());
  pf::save_safetensors(weights.string(), ps);
  return t.evaluate();
}

nlohmann::json json_of(const pf_test::Launch& r) {
  EXPECT_EQ(r.status, 0) << r.out;
  const auto lines = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
  return nlohmann::json::parse(lines.substr(lines.rfind('\n') == std::string::npos ? 0 : lines.rfind('\n') + 1));
}

class EvalCli : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalCli, LossEqualsTheTrainersEvaluate) {
  const auto sets = tiny_sets(GetParam());
  const fs::path w = pf_test::scratch_dir("infer_cli") / ("eval-" + GetParam() + ".safetensors");
  const double trainer_loss = train_and_save(sets, w, 2);
  const auto j = json_of(run(std::string(PF_BINARY) + " eval" + set_flags(sets) + " --init " + w.string() + " --json"));
  const double loss = j.at("loss").get<double>();
  // The same forward on the same sequences with one thread: equal up to float32 rounding (~100 ulps
  // allows another BLAS kernel family in the launched process; another batch differs by ~1e-2).
  EXPECT_NEAR(loss, trainer_loss, 1e-5 * trainer_loss) << j.dump();
  EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(loss), 1e-9 * std::exp(loss));
  EXPECT_EQ(j.at("sequences").get<int>(), 3 * 4);
  EXPECT_GT(j.at("positions").get<int>(), 0);

  // Fresh (untrained) weights score differently: the loss really comes from --init's file.
  const fs::path w0 = w.parent_path() / ("eval0-" + GetParam() + ".safetensors");
  train_and_save(sets, w0, 0);
  const auto j0 = json_of(run(std::string(PF_BINARY) + " eval" + set_flags(sets) + " --init " + w0.string() + " --json"));
  EXPECT_NE(j0.at("loss").get<double>(), loss);
}

INSTANTIATE_TEST_SUITE_P(Arch, EvalCli, ::testing::Values("gpt", "bert", "llama"));

// eval's standard error of the LM loss, against the two micro-batches' own means: `--batches 1`
// scores the first alone, `--batches 2` both, so the second's mean and both position counts follow,
// and batch_mean_standard_error's formula is evaluated here from them. One micro-batch: null.
TEST_P(EvalCli, StandardErrorOfTheLossFromTheMicroBatchesMeans) {
  const auto sets = tiny_sets(GetParam());
  const fs::path w = pf_test::scratch_dir("infer_cli") / ("se-" + GetParam() + ".safetensors");
  train_and_save(sets, w, 2);
  const std::string eval = std::string(PF_BINARY) + " eval" + set_flags(sets) + " --init " + w.string() + " --json";
  const auto one = json_of(run(eval + " --batches 1")), two = json_of(run(eval + " --batches 2"));
  EXPECT_TRUE(one.at("lm_loss_se").is_null()) << one.dump();
  const double m1 = one.at("lm_loss").get<double>(), m = two.at("lm_loss").get<double>();
  const double n1 = one.at("positions").get<double>(), n = two.at("positions").get<double>(), n2 = n - n1;
  const double m2 = (m * n - m1 * n1) / n2;
  const double want = std::sqrt(2.0 * (std::pow(n1 * (m1 - m) / n, 2) + std::pow(n2 * (m2 - m) / n, 2)));
  ASSERT_GT(want, 0);
  // Both sides from float32 forwards summed in double: equal to float32 rounding of the losses.
  EXPECT_NEAR(two.at("lm_loss_se").get<double>(), want, 1e-5 * m) << two.dump();
}

// On a terminal (script(1) gives it one) eval shows its progress over the micro-batches, as
// training's status line does; into a pipe it prints its result alone.
TEST(EvalProgress, ShownOnATerminalOnly) {
  const auto sets = tiny_sets("bert");
  const fs::path w = pf_test::scratch_dir("infer_cli") / "progress.safetensors";
  train_and_save(sets, w, 1);
  const std::string eval = std::string(PF_BINARY) + " eval" + set_flags(sets) + " --init " + w.string() + " --batches 3";
  const pf_test::Launch tty = run("script -qec \"" + eval + "\" /dev/null");
  EXPECT_EQ(tty.status, 0) << tty.out;
  EXPECT_NE(tty.out.find("\reval --init micro-batch 3/3 | "), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("eval: "), std::string::npos) << tty.out;
  const pf_test::Launch pipe = run(eval);
  EXPECT_EQ(pipe.status, 0) << pipe.out;
  EXPECT_EQ(pipe.out.find("micro-batch"), std::string::npos) << pipe.out;
}

// --baseline: the difference is --init's LM loss minus the baseline's, each as eval alone prints
// it (the same doubles, summed the same way), and its paired standard error is the formula's on the
// two micro-batches' differences, from --batches 1 and 2 as above. Weights against themselves: 0, 0.
TEST_P(EvalCli, BaselineGivesThePairedDifferenceAndItsStandardError) {
  const auto sets = tiny_sets(GetParam());
  const fs::path dir = pf_test::scratch_dir("infer_cli");
  const fs::path a = dir / ("pa-" + GetParam() + ".safetensors"), b = dir / ("pb-" + GetParam() + ".safetensors");
  train_and_save(sets, a, 2);
  train_and_save(sets, b, 0);
  const std::string eval = std::string(PF_BINARY) + " eval" + set_flags(sets) + " --json --init ";
  const auto ja = json_of(run(eval + a.string() + " --batches 2")), jb = json_of(run(eval + b.string() + " --batches 2"));
  const auto p = json_of(run(eval + a.string() + " --baseline " + b.string() + " --batches 2"));
  EXPECT_EQ(p.at("lm_loss").get<double>(), ja.at("lm_loss").get<double>()) << p.dump();
  EXPECT_EQ(p.at("baseline_lm_loss").get<double>(), jb.at("lm_loss").get<double>()) << p.dump();
  EXPECT_EQ(p.at("lm_loss_diff").get<double>(), ja.at("lm_loss").get<double>() - jb.at("lm_loss").get<double>());

  // Each micro-batch's difference from --batches 1 (the first) and 2 (both).
  const auto p1 = json_of(run(eval + a.string() + " --baseline " + b.string() + " --batches 1"));
  EXPECT_TRUE(p1.at("lm_loss_diff_se").is_null()) << p1.dump();
  const double n = ja.at("positions").get<double>();
  const double n1 = json_of(run(eval + a.string() + " --batches 1")).at("positions").get<double>(), n2 = n - n1;
  const double d1 = p1.at("lm_loss_diff").get<double>(), d = p.at("lm_loss_diff").get<double>();
  const double d2 = (d * n - d1 * n1) / n2;
  const double want = std::sqrt(2.0 * (std::pow(n1 * (d1 - d) / n, 2) + std::pow(n2 * (d2 - d) / n, 2)));
  ASSERT_GT(want, 0);
  EXPECT_NEAR(p.at("lm_loss_diff_se").get<double>(), want, 1e-5 * ja.at("lm_loss").get<double>()) << p.dump();

  // --per-batch: the shares behind both numbers, so records can be paired later.
  const auto sa = json_of(run(eval + a.string() + " --batches 2 --per-batch"));
  const auto sb = json_of(run(eval + b.string() + " --batches 2 --per-batch"));
  ASSERT_EQ(sa.at("lm_shares").size(), 2u) << sa.dump();
  EXPECT_EQ(sa.at("lm_shares")[0].get<double>() + sa.at("lm_shares")[1].get<double>(), ja.at("lm_loss").get<double>());
  EXPECT_EQ(sa.at("batch_positions"), sb.at("batch_positions"));
  EXPECT_EQ(sa.at("batch_positions")[0].get<double>(), n1);
  // The first micro-batch's share of the two-batch mean is n1 / n of its own mean (the loss scale
  // differs, so equal to float32 rounding).
  EXPECT_NEAR(sa.at("lm_shares")[0].get<double>() - sb.at("lm_shares")[0].get<double>(), d1 * n1 / n,
              1e-5 * ja.at("lm_loss").get<double>());

  const auto self = json_of(run(eval + a.string() + " --baseline " + a.string() + " --batches 2"));
  EXPECT_EQ(self.at("lm_loss_diff").get<double>(), 0.0);
  EXPECT_EQ(self.at("lm_loss_diff_se").get<double>(), 0.0);

  const auto missing = run(eval + a.string() + " --baseline " + (dir / "none.safetensors").string());
  EXPECT_EQ(missing.status, 2) << missing.out;
  EXPECT_EQ(missing.out.rfind("pipefisher: --baseline: no such file", 0), 0u) << missing.out;
}

std::string generate_cmd(const std::vector<std::string>& sets, const fs::path& w, const std::string& extra) {
  return std::string(PF_BINARY) + " generate" + set_flags(sets) + " --init " + w.string() + " --vocab-dir " +
         PF_SOURCE_DIR + "/data/vocab --prompt 'Call me Ishmael. Some years ago' --json " + extra;
}

TEST(GenerateCli, SameSeedSameTextOtherSeedOtherText) {
  for (const std::string arch : {"gpt", "llama"}) {
  SCOPED_TRACE(arch);
  const auto sets = tiny_sets(arch);
  const fs::path w = pf_test::scratch_dir("infer_cli") / ("gen-" + arch + ".safetensors");
  train_and_save(sets, w, 2);
  const std::string cmd = generate_cmd(sets, w, "--max-new-tokens 12 --temperature 1 --top-k 50");
  const auto a = json_of(run(cmd + " --seed 5")), b = json_of(run(cmd + " --seed 5")), c = json_of(run(cmd + " --seed 6"));
  EXPECT_EQ(a.at("ids"), b.at("ids"));
  EXPECT_EQ(a.at("text"), b.at("text"));
  EXPECT_EQ(a.at("ids").size(), 12u);
  EXPECT_NE(a.at("ids"), c.at("ids"));  // 12 draws among 50 candidates each: equal by chance ~never
  }
}

// Issue 50, item 7: byte-level tokens cut characters in two; --json prints what was generated for
// every seed, bytes that are no UTF-8 as U+FFFD (before: "invalid UTF-8 byte", nothing printed).
TEST(GenerateCli, JsonOfTextCutMidCharacterIsPrinted) {
  const auto sets = tiny_sets("gpt");
  const fs::path w = pf_test::scratch_dir("infer_cli") / "utf8.safetensors";
  train_and_save(sets, w, 1);
  const std::string cmd = generate_cmd(sets, w, "--max-new-tokens 200 --temperature 1");
  int replaced = 0;
  for (int seed = 1; seed <= 5; ++seed) {
    const auto j = json_of(run(cmd + " --seed " + std::to_string(seed)));
    EXPECT_FALSE(j.at("ids").empty()) << seed;
    replaced += j.at("text").get<std::string>().find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(replaced, 0) << "no seed cut a character: the case is not tested";
}

// The logits of the last position, computed here: the transformer body's output (the model
// without its head), then GPT-2's head written out from the weights file: ln_f, then the
// tied word embedding.
std::vector<double> reference_logits(pf::Model& body, const std::map<std::string, std::vector<float>>& w,
                                     const std::vector<int32_t>& ctx, int hidden) {
  pf::MicroBatch mb;
  mb.resize(1, static_cast<int>(ctx.size()));
  std::copy(ctx.begin(), ctx.end(), mb.tokens.begin());
  std::fill(mb.labels.begin(), mb.labels.end(), -1);
  std::fill(mb.attn_mask.begin(), mb.attn_mask.end(), 1);
  pf::ModelState st = body.make_state(1, static_cast<int>(ctx.size()));
  pf::Tensor out({1, static_cast<int64_t>(ctx.size()), hidden}), none;
  body.forward(mb, none, out, st);
  const float* x = out.data() + (ctx.size() - 1) * hidden;
  double mean = 0, var = 0;
  for (int c = 0; c < hidden; ++c) mean += x[c];
  mean /= hidden;
  for (int c = 0; c < hidden; ++c) var += (x[c] - mean) * (x[c] - mean);
  var /= hidden;
  std::vector<double> h(hidden);
  const auto &g = w.at("transformer.ln_f.weight"), &b = w.at("transformer.ln_f.bias"), &wte = w.at("transformer.wte.weight");
  for (int c = 0; c < hidden; ++c) h[c] = (x[c] - mean) / std::sqrt(var + 1e-5) * g[c] + b[c];
  std::vector<double> logits(wte.size() / hidden);
  for (size_t v = 0; v < logits.size(); ++v) {
    double s = 0;
    for (int c = 0; c < hidden; ++c) s += h[c] * wte[v * hidden + c];
    logits[v] = s;
  }
  return logits;
}

// The text streams token by token; Ctrl-C stops it there, keeps what was printed and exits 130.
TEST(GenerateCli, PrintsEachTokenAsItComesAndCtrlCKeepsThem) {
  const auto sets = tiny_sets("gpt");
  const fs::path w = pf_test::scratch_dir("infer_cli") / "stream.safetensors";
  train_and_save(sets, w, 1);
  const std::string prompt = "Ishmael";  // Job runs the command inside sh -c '...': no quotes in it
  pf_test::Job job(std::string(PF_BINARY) + " generate" + set_flags(sets) + " --init " + w.string() + " --vocab-dir " +
                   PF_SOURCE_DIR + "/data/vocab --prompt " + prompt + " --max-new-tokens 1000000 --seed 3");
  ASSERT_GT(job.pid, 0);
  // Tokens arrive without a newline: read bytes until a few follow the prompt, while it runs.
  std::string seen;
  for (int c; seen.size() < prompt.size() + 8 && (c = std::fgetc(job.p)) != EOF;) seen += static_cast<char>(c);
  ASSERT_EQ(seen.substr(0, prompt.size()), prompt) << seen;
  ASSERT_GT(seen.size(), prompt.size()) << "tokens printed before the generation ended";
  kill(job.pid, SIGINT);
  std::string rest;
  for (int c; (c = std::fgetc(job.p)) != EOF;) rest += static_cast<char>(c);
  EXPECT_EQ(job.finish(), 130) << seen << rest;
  EXPECT_NE(rest.find("pipefisher generate: SIGINT after "), std::string::npos) << rest;
  EXPECT_LT(rest.size(), 10000u) << "it stopped at the interrupt, not after a million tokens";
}

TEST(GenerateCli, GreedyIsTheArgmaxOfTheLogits) {
  const auto sets = tiny_sets("gpt");
  const fs::path w = pf_test::scratch_dir("infer_cli") / "greedy.safetensors";
  train_and_save(sets, w, 3);
  const int n = 20;  // more than model.seq_len = 16 - prompt: the context window slides
  const auto j = json_of(run(generate_cmd(sets, w, "--max-new-tokens " + std::to_string(n) + " --temperature 0")));
  auto ctx = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto ids = j.at("ids").get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), static_cast<size_t>(n));

  const pf::Config cfg = pf::Config::from_toml_string("", sets);
  auto body = pf::build_model(cfg.model, 0, cfg.model.layers);  // embedding + blocks, no head
  pf::load_safetensors(w.string(), body->params(), {true, true});
  const auto weights = pf_test::read_weights(w);
  int checked = 0;
  for (int32_t id : ids) {
    if (ctx.size() > static_cast<size_t>(cfg.model.seq_len)) ctx.erase(ctx.begin());
    const auto logits = reference_logits(*body, weights, ctx, cfg.model.hidden);
    std::vector<double> sorted = logits;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const size_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    // Only where the top two differ by more than float32 rounding of a 32-term dot product.
    if (sorted[0] - sorted[1] > 1e-5 * (1 + std::abs(sorted[0]))) {
      EXPECT_EQ(static_cast<size_t>(id), best) << "token " << checked;
      ++checked;
    }
    ctx.push_back(id);
  }
  EXPECT_GE(checked, n / 2);
}

// Nucleus sampling keeps the most likely tokens whose probabilities first reach top_p and draws
// among them in proportion: p = (0.5, 0.25, 0.15, 0.07, 0.03) with top_p 0.7 keeps ids 0 and 1,
// drawn 2:1; 0.4 keeps id 0 only; 1 keeps all five.
TEST(GenerateSampling, TopPKeepsTheNucleusInProportion) {
  const std::vector<double> p = {0.5, 0.25, 0.15, 0.07, 0.03};
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  auto counts = [&](double top_p, int top_k) {
    std::vector<int> n(p.size(), 0);
    for (uint64_t draw = 0; draw < 3000; ++draw)
      ++n.at(static_cast<size_t>(pf::sample_token(logits, {.temperature = 1, .top_k = top_k, .top_p = top_p, .seed = 7}, draw)));
    return n;
  };
  const std::vector<int> nucleus = counts(0.7, 0);
  EXPECT_EQ(nucleus[2] + nucleus[3] + nucleus[4], 0);
  EXPECT_NEAR(nucleus[0] / 3000.0, 2.0 / 3, 0.03);  // 3.5 standard errors of 3000 draws at p = 2/3 (0.0086)
  EXPECT_EQ(counts(0.4, 0)[0], 3000);
  for (int n : counts(1.0, 0)) EXPECT_GT(n, 0);
  EXPECT_EQ(counts(0.7, 1)[0], 3000);  // top-k first, then top-p
}

struct Refusal {
  std::string args, prefix;
  friend std::ostream& operator<<(std::ostream& os, const Refusal& r) { return os << r.args; }
};

class InferRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(InferRefusal, ExitTwoWithOneLineNamingTheFlag) {
  const auto sets = tiny_sets("gpt");
  const fs::path w = pf_test::scratch_dir("infer_cli") / "refusal.safetensors";
  if (!fs::exists(w)) train_and_save(sets, w, 0);
  std::string args = GetParam().args;
  for (size_t p; (p = args.find("WEIGHTS")) != std::string::npos;) args.replace(p, 7, w.string());
  const auto r = run(std::string(PF_BINARY) + " " + args);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out.rfind("pipefisher: " + GetParam().prefix, 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, InferRefusal,
    ::testing::Values(Refusal{"eval --set model.arch=gpt", "--init"},
                      Refusal{"generate --set model.arch=gpt --init /nonexistent.safetensors", "--init"},
                      Refusal{"generate --init WEIGHTS --temperature -1", "--temperature"},
                      Refusal{"generate --init WEIGHTS --temperature inf", "--temperature: must be a finite number"},
                      Refusal{"generate --init WEIGHTS --temperature nan", "--temperature: must be a finite number"},
                      Refusal{"generate --init WEIGHTS --top-k -2", "--top-k"},
                      Refusal{"generate --init WEIGHTS --top-p 0", "--top-p: must be in (0, 1]"},
                      Refusal{"generate --init WEIGHTS --top-p 1.5", "--top-p: must be in (0, 1]"},
                      Refusal{"generate --init WEIGHTS --top-p nan", "--top-p: must be in (0, 1]"},
                      Refusal{"generate --init WEIGHTS --max-new-tokens x", "--max-new-tokens"},
                      Refusal{"eval --init WEIGHTS --batches -1", "--batches"},
                      Refusal{"eval --init WEIGHTS --bogus", "eval: unknown flag --bogus"},
                      Refusal{"eval --init WEIGHTS --per-batch", "--per-batch: lists the micro-batches"},
                      Refusal{"generate --init WEIGHTS --max-new-token 3",
                              "generate: unknown flag --max-new-token (did you mean --max-new-tokens?)"},
                      Refusal{"generate --set model.arch=bert --set model.layers=2 --set model.hidden=32 "
                              "--set model.heads=2 --set model.ffn=64 --init WEIGHTS",
                              "model.arch"}));

}  // namespace
