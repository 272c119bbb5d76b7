#include "config/config.hpp"
#include "core/error.hpp"

#include <gtest/gtest.h>

using pf::Config;

namespace {
// Returns the UsageError message of loading `toml` with `sets`, or "" if it loads.
std::string error_of(const std::string& toml, std::vector<std::string> sets = {}) {
  try {
    Config::from_toml_string(toml, sets);
  } catch (const pf::UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, DefaultsAreValid) {
  Config c = Config::from_toml_string("");
  EXPECT_EQ(c.model.arch, "bert");
  EXPECT_EQ(c.model.gelu, "erf");
  EXPECT_EQ(c.data.train_file, "data/corpus/train.bert.bin");
  EXPECT_EQ(c.model.hidden, 256);  // the default job is bert-mini-shaped
  Config g = Config::from_toml_string("", {"model.arch=gpt"});
  EXPECT_EQ(g.model.vocab, 50257);
  EXPECT_EQ(g.data.vocab, "gpt2");
  EXPECT_FLOAT_EQ(g.model.layer_norm_eps, 1e-5f);
}

TEST(Config, PresetThenExplicitKeysWin) {
  Config c = Config::from_toml_string("[model]\npreset = \"bert-base\"\nlayers = 3\n");
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.model.ffn, 3072);
  EXPECT_EQ(c.model.layers, 3);
  Config g = Config::from_toml_string("", {"model.preset=gpt2-small"});
  EXPECT_EQ(g.model.arch, "gpt");
  EXPECT_EQ(g.model.gelu, "tanh");
  EXPECT_FLOAT_EQ(g.model.layer_norm_eps, 1e-5f);
  EXPECT_EQ(g.data.vocab, "gpt2");
  EXPECT_EQ(g.model.vocab, 50257);
}

TEST(Config, OverridesParseTomlValues) {
  Config c = Config::from_toml_string("", {"optim.lr=2e-4", "data.shuffle=false", "optim.name=adamw",
                                           "parallel.partition=[3,1]", "train.out_dir=runs/x"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 2e-4);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_EQ(c.parallel.partition, (std::vector<int>{3, 1}));
  EXPECT_EQ(c.train.out_dir, "runs/x");
}

TEST(Config, BadInputNamesTheKey) {
  EXPECT_EQ(error_of("[model]\nlayerz = 2\n"), "model.layerz: unknown configuration key (did you mean model.layers?)");
  EXPECT_EQ(error_of("", {"modle.layers=2"}), "modle: unknown configuration table (did you mean [model]?)");
  EXPECT_EQ(error_of("", {"model.hidden=0"}), "model.hidden: must be positive (got 0)");
  EXPECT_EQ(error_of("", {"model.hidden=100", "model.heads=3"}),
            "model.hidden: 100 is not divisible by model.heads = 3");
  EXPECT_EQ(error_of("", {"model.layers=two"}), "model.layers: expected an integer");
  EXPECT_EQ(error_of("", {"optim.name=adam"}), "optim.name: 'adam' is not one of nvlamb, adamw, sgd");
  EXPECT_EQ(error_of("", {"model.preset=bert-huge"}).rfind("model.preset: unknown preset 'bert-huge'", 0), 0u);
  EXPECT_EQ(error_of("", {"parallel.partition=[1,2]"}),
            "parallel.partition: assigns 3 transformer blocks but model.layers = 4");
  EXPECT_EQ(error_of("", {"model.seq_len=1024"}), "model.seq_len: 1024 exceeds model.max_position = 512");
  EXPECT_EQ(error_of("", {"model.vocab=1000"}),
            "model.vocab: 1000 is smaller than the bert tokenizer's vocabulary (30522)");
  EXPECT_EQ(error_of("[model\n").rfind("config: line 1", 0), 0u);
}

TEST(Config, MissingDataFileIsNamed) {
  Config c = Config::from_toml_string("", {"data.train_file=/nonexistent/x.bin"});
  try {
    c.check_files();
    FAIL();
  } catch (const pf::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("data.train_file: no such file '/nonexistent/x.bin'", 0), 0u);
  }
}

TEST(Config, RoundTripsThroughToml) {
  Config a = Config::from_toml_string("", {"model.preset=bert-mini", "optim.lr=3e-4", "parallel.partition=[3,1]",
                                            "kfac.split_inversions=true"});
  Config b = Config::from_toml_string(a.to_toml());
  EXPECT_EQ(b.to_toml(), a.to_toml());
  EXPECT_TRUE(b.kfac.split_inversions);  // not the default (false): it round-trips
  EXPECT_EQ(b.model.hidden, 256);
  EXPECT_EQ(b.parallel.partition, (std::vector<int>{3, 1}));
}

// data.nsp (BERT's next-sentence prediction, off by default) reaches the model, round-trips, and
// is refused where it cannot apply; kfac.plan_profile only with K-FAC in the bubbles.
TEST(Config, NextSentencePredictionAndPlanProfileKeys) {
  Config d = Config::from_toml_string("");
  EXPECT_FALSE(d.data.nsp);
  EXPECT_FALSE(d.model.nsp);
  EXPECT_TRUE(d.kfac.plan_profile.empty());
  // (A pipeline: with one stage the default placement is inline, where a plan profile does not apply.)
  Config a = Config::from_toml_string("", {"data.nsp=true", "kfac.enabled=true", "parallel.stages=2",
                                           "kfac.plan_profile=/tmp/p.json"});
  EXPECT_TRUE(a.model.nsp);
  Config b = Config::from_toml_string(a.to_toml());
  EXPECT_TRUE(b.data.nsp);
  EXPECT_TRUE(b.model.nsp);
  EXPECT_EQ(b.kfac.plan_profile, "/tmp/p.json");
  EXPECT_EQ(error_of("", {"model.arch=gpt", "data.nsp=true"}), "data.nsp: next-sentence prediction is BERT's (model.arch = gpt)");
  EXPECT_EQ(error_of("", {"data.nsp=true", "model.seq_len=4"}).rfind("data.nsp: a sentence pair needs", 0), 0u);
  EXPECT_EQ(error_of("", {"kfac.plan_profile=/tmp/p.json"}),
            "kfac.plan_profile: only applies with kfac.enabled = true and kfac.placement = bubbles");
  Config missing = Config::from_toml_string("", {"kfac.enabled=true", "parallel.stages=2",
                                                 "kfac.plan_profile=/nonexistent/p.json",
                                                 "data.train_file=" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin",
                                                 "data.valid_file=" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin"});
  try {
    missing.check_files();
    FAIL();
  } catch (const pf::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("kfac.plan_profile: no such file '/nonexistent/p.json'", 0), 0u) << e.what();
  }
}

// parallel.recompute (activation recomputation, off by default) parses as a bool, round-trips, and
// says so when one stage has nothing to recompute.
TEST(Config, RecomputeKey) {
  EXPECT_FALSE(Config::from_toml_string("").parallel.recompute);
  Config a = Config::from_toml_string("", {"parallel.recompute=true", "parallel.stages=2"});
  EXPECT_TRUE(a.parallel.recompute);
  EXPECT_TRUE(Config::from_toml_string(a.to_toml()).parallel.recompute);
  EXPECT_NE(a.to_toml().find("recompute = true"), std::string::npos);
  EXPECT_EQ(error_of("", {"parallel.recompute=1"}), "parallel.recompute: expected true or false");
  EXPECT_TRUE(pf::config_warnings(a).empty());
  const auto w = pf::config_warnings(Config::from_toml_string("", {"parallel.recompute=true"}));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("parallel.recompute = true has no effect with parallel.stages = 1", 0), 0u) << w[0];
}

// parallel.backward_forward_ratio (Chimera's T_b / T_f, 2 by default) round-trips and is bounded.
TEST(Config, BackwardForwardRatioKey) {
  EXPECT_EQ(Config::from_toml_string("").parallel.backward_forward_ratio, 2.0);
  Config a = Config::from_toml_string("", {"parallel.backward_forward_ratio=1.25"});
  EXPECT_EQ(a.parallel.backward_forward_ratio, 1.25);
  EXPECT_EQ(Config::from_toml_string(a.to_toml()).parallel.backward_forward_ratio, 1.25);
  for (const char* bad : {"0", "-1", "1e4"})
    EXPECT_EQ(error_of("", {std::string("parallel.backward_forward_ratio=") + bad}).rfind(
                  "parallel.backward_forward_ratio: must be between 0.001 and 1000", 0), 0u) << bad;
}

TEST(Config, NumbersPrintInTheirShortestExactForm) {
  for (double d : {0.1, 1e-3, 3e-4, 1e-12, 0.15, 2.0, 1234567.0, 0.1 + 0.2, 1e-300}) {
    const std::string s = pf::shortest_double(d);
    EXPECT_EQ(std::stod(s), d) << s;  // exact
    EXPECT_NE(s.find_first_of(".e"), std::string::npos) << s << " would read back as an integer";
  }
  EXPECT_EQ(pf::shortest_double(0.1), "0.1");
  EXPECT_EQ(pf::shortest_double(2.0), "2.0");
  EXPECT_EQ(pf::shortest_double(0.1 + 0.2), "0.30000000000000004");  // not 0.3: that is another double
  EXPECT_EQ(pf::float_as_written(0.15f), 0.15);
  EXPECT_EQ(static_cast<float>(pf::float_as_written(0.15f)), 0.15f);
  EXPECT_EQ(pf::float_as_written(1e-12f), 1e-12);
}

TEST(Config, BannerNamesThePresetAndTheOptimizer) {
  EXPECT_EQ(pf::preset_of(Config{}.model), "bert-mini");  // the default job's shape
  EXPECT_EQ(pf::preset_of(Config::from_toml_string("", {"model.preset=\"gpt2-tiny\""}).model), "gpt2-tiny");
  EXPECT_EQ(pf::preset_of(Config::from_toml_string("", {"model.preset=\"bert-tiny\"", "model.layers=3"}).model),
            "custom (bert-tiny, resized)");
  EXPECT_EQ(pf::preset_of(Config::from_toml_string("", {"model.hidden=64", "model.heads=2"}).model), "custom");
  EXPECT_EQ(pf::optimizer_of(Config{}), "nvlamb");
  EXPECT_EQ(pf::optimizer_of(Config::from_toml_string("", {"kfac.enabled=true", "kfac.placement=\"inline\""})),
            "nvlamb + K-FAC (inline)");
  EXPECT_EQ(pf::optimizer_of(Config::from_toml_string("", {"kfac.enabled=true", "parallel.stages=2"})),
            "nvlamb + K-FAC (in the pipeline bubbles: PipeFisher)");
  EXPECT_EQ(pf::optimizer_of(Config::from_toml_string("", {"kfac.enabled=true", "parallel.data_parallel=4",
                                                            "optim.name=\"adamw\""})),
            "adamw + K-FAC (inline, spd-kfac)");
  // One stage has no bubbles: its default placement is inline; a pipeline's stays bubbles.
  EXPECT_EQ(Config::from_toml_string("", {"kfac.enabled=true"}).kfac.placement, "inline");
  EXPECT_EQ(Config::from_toml_string("", {"kfac.enabled=true", "parallel.stages=2"}).kfac.placement, "bubbles");
  EXPECT_EQ(Config::from_toml_string("", {"kfac.placement=\"bubbles\""}).kfac.placement, "bubbles");
}

TEST(Config, MisspeltKeysGetASuggestion) {
  EXPECT_EQ(error_of("[model]\nlayerz = 3\n"), "model.layerz: unknown configuration key (did you mean model.layers?)");
  EXPECT_EQ(error_of("[optim]\nwarmup = 3\n"), "optim.warmup: unknown configuration key");  // too far to guess
  EXPECT_EQ(error_of("[kfca]\nenabled = true\n"), "kfca: unknown configuration table (did you mean [kfac]?)");
}

TEST(Config, WarnsWhenWarmupOutlastsTheRun) {
  EXPECT_TRUE(pf::config_warnings(Config{}).empty());
  const auto w = pf::config_warnings(Config::from_toml_string("", {"train.steps=5", "optim.warmup_steps=10"}));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], "optim.warmup_steps = 10 exceeds train.steps = 5: the learning rate never reaches optim.lr = 0.01");
  // With K-FAC's own warm-up set, that one is in effect.
  EXPECT_TRUE(pf::config_warnings(Config::from_toml_string(
                  "", {"train.steps=5", "optim.warmup_steps=10", "kfac.enabled=true", "kfac.placement=\"inline\"",
                       "kfac.warmup_steps=2"}))
                  .empty());
}
