// Hugging Face round trip: a run's model.safetensors + config.json read back by an independent
// reader (tests/apps/hf_check.py: PyTorch, GPT-2 written from its definition), and `--init`
// taking the hub's other layouts, naming the tensors it did not use.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"
#include "../support/weights.hpp"
#include "io/safetensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using pf_test::run;

namespace {

std::string sample(const std::string& arch) {
  return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20." + (arch == "bert" ? "bert" : "gpt2") + ".bin";
}

std::string replace_all(std::string s, const std::string& a, const std::string& b) {
  for (size_t p = 0; (p = s.find(a, p)) != std::string::npos; p += b.size()) s.replace(p, a.size(), b);
  return s;
}

std::string model_flags(const std::string& arch) {
  std::string s = " --set model.arch=" + arch +
                  " --set model.layers=2 --set model.hidden=32 --set model.heads=2 --set model.ffn=64"
                  " --set model.seq_len=16 --set parallel.micro_batches=1 --set parallel.micro_batch_size=4"
                  " --set train.threads=1 --set data.train_file=" + sample(arch) + " --set data.valid_file=" + sample(arch);
  // llama: 2 key/value heads for 4 query heads (which query heads share one is what a wrong
  // grouping would get wrong), its own lm_head; "llama-tied" its tied head. Weights drawn with
  // std 0.3 so that attention is far from uniform: a rotation turned the wrong way moves the loss
  // by 1%, 10^4 times the tolerance below.
  if (arch.starts_with("llama"))
    s = replace_all(replace_all(s, "model.arch=" + arch, "model.arch=llama"), "model.heads=2", "model.heads=4") +
        " --set model.kv_heads=2 --set model.init_std=0.3 --set model.tie_embeddings=" + (arch == "llama" ? "false" : "true");
  return s;
}

nlohmann::json last_json_line(const pf_test::Launch& r) {
  EXPECT_EQ(r.status, 0) << r.out;
  std::string s = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
  const size_t nl = s.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? s : s.substr(nl + 1));
}

// Trains 2 steps of `arch` into scratch/<arch>; returns the run directory.
fs::path trained_run(const std::string& arch) {
  const fs::path dir = pf_test::scratch_dir("hf_cli") / arch;
  if (fs::exists(dir / "config.json")) return dir;
  const auto r = run(std::string(PF_BINARY) + " train" + model_flags(arch) + " --steps 2 --set optim.warmup_steps=0" +
                     " --set train.out_dir=" + dir.string());
  EXPECT_EQ(r.status, 0) << r.out;
  return dir;
}

// Debian's interpreter: python3-torch (scripts/install-deps.sh) installs for it, whatever other
// python3 comes first on PATH.
nlohmann::json hf_check(const fs::path& run_dir, const std::string& extra = "") {
  return last_json_line(run("/usr/bin/python3 " + std::string(PF_SOURCE_DIR) + "/tests/apps/hf_check.py " + run_dir.string() + extra));
}

double eval_loss(const std::string& arch, const fs::path& weights, int batches, std::string* out = nullptr) {
  const auto r = run(std::string(PF_BINARY) + " eval" + model_flags(arch) + " --init " + weights.string() +
                     " --json --batches " + std::to_string(batches));
  if (out) *out = r.out;
  return last_json_line(r).at("loss").get<double>();
}

TEST(HfRoundTrip, Gpt2ReadBackByPyTorchGivesOurLoss) {
  const fs::path dir = trained_run("gpt");
  const auto j = hf_check(dir, " --valid " + sample("gpt") + " --seq 16 --sequences 8");
  EXPECT_EQ(j.at("architecture"), "GPT2LMHeadModel");
  EXPECT_EQ(j.at("model_type"), "gpt2");
  EXPECT_EQ(j.at("format"), "pt");
  EXPECT_TRUE(j.at("unexpected").empty()) << j.dump();
  EXPECT_TRUE(j.at("missing").empty()) << j.dump();
  EXPECT_TRUE(j.at("wrong_shape").empty()) << j.dump();
  // Ours in float32 over 8 x 16 tokens, PyTorch's in float64: equal to float32 rounding of the
  // forward (relative 1e-4 is ~1000 ulps, far below what a wrong layout or activation changes).
  const double ours = eval_loss("gpt", dir / "model.safetensors", 2);
  EXPECT_NEAR(j.at("loss").get<double>(), ours, 1e-4 * ours) << j.dump();
}

// Llama, untied and tied: read back as LlamaForCausalLM (transformers' names and shapes; no
// lm_head.weight when tied), and PyTorch's float64 forward written from modeling_llama gives our
// loss to float32 rounding: the rotary convention, grouped-query attention, RMSNorm and SwiGLU are
// those of Hugging Face's Llama.
TEST(HfRoundTrip, LlamaReadBackByPyTorchGivesOurLoss) {
  for (const std::string arch : {"llama", "llama-tied"}) {
    const fs::path dir = trained_run(arch);
    const auto j = hf_check(dir, " --valid " + sample(arch) + " --seq 16 --sequences 8");
    EXPECT_EQ(j.at("architecture"), "LlamaForCausalLM") << arch;
    EXPECT_EQ(j.at("model_type"), "llama");
    EXPECT_TRUE(j.at("unexpected").empty()) << j.dump();
    EXPECT_TRUE(j.at("missing").empty()) << j.dump();
    EXPECT_TRUE(j.at("wrong_shape").empty()) << j.dump();
    const double ours = eval_loss(arch, dir / "model.safetensors", 2);
    EXPECT_NEAR(j.at("loss").get<double>(), ours, 1e-4 * ours) << arch << ": " << j.dump();
  }
}

TEST(HfRoundTrip, BertIsBertForPreTraining) {
  const fs::path dir = trained_run("bert");
  const auto j = hf_check(dir);
  EXPECT_EQ(j.at("architecture"), "BertForPreTraining");
  EXPECT_EQ(j.at("model_type"), "bert");
  EXPECT_TRUE(j.at("unexpected").empty()) << j.dump();
  EXPECT_TRUE(j.at("wrong_shape").empty()) << j.dump();
  EXPECT_TRUE(j.at("missing").empty()) << j.dump();  // the pooler and the NSP head included
}

// Rewrites a saved model under other names (and extra tensors), as files on the hub have them.
void write_renamed(const fs::path& from, const fs::path& to, std::string (*rename)(const std::string&),
                   const std::vector<std::string>& extra) {
  const auto w = pf_test::read_weights(from);
  pf::SafetensorsReader r(from.string());
  std::vector<pf::SafetensorsTensor> ts;
  for (const auto& e : r.tensors()) ts.push_back({rename(e.name), e.shape, w.at(e.name)});
  static const std::vector<float> four(4, 1.0f);
  for (const auto& name : extra) ts.push_back({name, {2, 2}, four});
  pf::write_safetensors(to.string(), ts, {{"format", "pt"}});
}

TEST(HfInit, Gpt2WithoutTransformerPrefixLoadsAndNamesWhatItDidNotUse) {
  const fs::path dir = trained_run("gpt");
  const fs::path hub = dir / "hub-gpt2.safetensors";
  write_renamed(dir / "model.safetensors", hub,
                [](const std::string& n) { return n.rfind("transformer.", 0) == 0 ? n.substr(12) : std::string(n); },
                {"h.0.attn.bias", "lm_head.weight"});
  std::string out;
  EXPECT_EQ(eval_loss("gpt", hub, 2, &out), eval_loss("gpt", dir / "model.safetensors", 2));
  EXPECT_NE(out.find("--init: 2 of "), std::string::npos) << out;
  EXPECT_NE(out.find("h.0.attn.bias"), std::string::npos) << out;
  EXPECT_NE(out.find("lm_head.weight"), std::string::npos) << out;
}

TEST(HfInit, BertLegacyLayerNormGammaBetaLoads) {
  const fs::path dir = trained_run("bert");
  const fs::path hub = dir / "hub-bert.safetensors";
  write_renamed(dir / "model.safetensors", hub,
                [](const std::string& n) {
                  return replace_all(replace_all(n, "LayerNorm.weight", "LayerNorm.gamma"), "LayerNorm.bias",
                                     "LayerNorm.beta");
                },
                {});
  std::string out;
  EXPECT_EQ(eval_loss("bert", hub, 2, &out), eval_loss("bert", dir / "model.safetensors", 2));
  EXPECT_EQ(out.find("--init:"), std::string::npos) << "every tensor was used:\n" << out;
}

TEST(HfInit, AMissingTensorIsNamedUnderItsOwnName) {
  const fs::path dir = trained_run("gpt");
  const fs::path cut = dir / "cut.safetensors";
  write_renamed(dir / "model.safetensors", cut,
                [](const std::string& n) { return n == "transformer.ln_f.weight" ? std::string("something.else") : n; }, {});
  const auto r = run(std::string(PF_BINARY) + " eval" + model_flags("gpt") + " --init " + cut.string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("tensor 'transformer.ln_f.weight'"), std::string::npos) << r.out;
}

// An HF Llama folder as --init: LlamaModel's headless names load (the shape from config.json);
// what we do not compute is refused naming the field, before anything runs.
TEST(HfInit, LlamaFolderLoadsAndRefusesWhatWeDoNotCompute) {
  const fs::path dir = trained_run("llama");
  const fs::path hub = pf_test::scratch_dir("hf_cli") / "hub-llama";
  fs::create_directories(hub);
  write_renamed(dir / "model.safetensors", hub / "model.safetensors",
                [](const std::string& n) { return n.rfind("model.", 0) == 0 ? n.substr(6) : std::string(n); }, {});
  fs::copy_file(dir / "config.json", hub / "config.json", fs::copy_options::overwrite_existing);
  const std::string data = " --set data.valid_file=" + sample("llama") + " --set model.seq_len=16" +
                           " --set parallel.micro_batch_size=4 --set train.threads=1 --json --batches 2";
  const auto folder = run(std::string(PF_BINARY) + " eval --init " + hub.string() + data);
  EXPECT_EQ(last_json_line(folder).at("loss").get<double>(), eval_loss("llama", dir / "model.safetensors", 2));
  auto config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}, {"attention_bias", true}, {"hidden_act", "gelu"}}) {
    nlohmann::json changed = config;
    changed[field] = value;
    std::ofstream(hub / "config.json") << changed.dump();
    const auto r = run(std::string(PF_BINARY) + " eval --init " + hub.string() + data);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("': " + field + " is "), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

}  // namespace
