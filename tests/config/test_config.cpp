#include "config/config.hpp"
#include "config/limits.hpp"
#include "core/error.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

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
  EXPECT_EQ(c.model.arch, pf::Arch::Bert);
  EXPECT_EQ(c.model.gelu, pf::Gelu::Erf);
  // Found in ./data, else in the program's source tree; absolute either way.
  EXPECT_TRUE(c.data.train_file.ends_with("/data/corpus/train.bert.bin")) << c.data.train_file;
  EXPECT_TRUE(std::filesystem::path(c.data.train_file).is_absolute()) << c.data.train_file;
  EXPECT_EQ(c.model.hidden, 256);  // the default job is bert-mini-shaped
  Config g = Config::from_toml_string("", {"model.arch=gpt"});
  EXPECT_EQ(g.model.vocab, 50257);
  EXPECT_EQ(g.data.vocab, pf::Vocab::Gpt2);
  EXPECT_FLOAT_EQ(g.model.layer_norm_eps, 1e-5f);
}

TEST(Config, PresetThenExplicitKeysWin) {
  Config c = Config::from_toml_string("[model]\npreset = \"bert-base\"\nlayers = 3\n");
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.model.ffn, 3072);
  EXPECT_EQ(c.model.layers, 3);
  Config g = Config::from_toml_string("", {"model.preset=gpt2-small"});
  EXPECT_EQ(g.model.arch, pf::Arch::Gpt);
  EXPECT_EQ(g.model.gelu, pf::Gelu::Tanh);
  EXPECT_FLOAT_EQ(g.model.layer_norm_eps, 1e-5f);
  EXPECT_EQ(g.data.vocab, pf::Vocab::Gpt2);
  EXPECT_EQ(g.model.vocab, 50257);
}

TEST(Config, OverridesParseTomlValues) {
  Config c = Config::from_toml_string("", {"optim.lr=2e-4", "data.shuffle=false", "optim.name=adamw",
                                           "parallel.partition=[3,1]", "train.out_dir=runs/x"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 2e-4);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.optim.name, pf::OptimName::AdamW);
  EXPECT_EQ(c.parallel.partition, (std::vector<int>{3, 1}));
  EXPECT_EQ(c.train.out_dir, (std::filesystem::current_path() / "runs/x").string());  // against the current directory
}

// A file's relative paths resolve against its directory, --set's against the current one; an
// absolute path is kept as written. --set model.preset brings the preset's sizes over the file's.
TEST(Config, FilePathsResolveAgainstTheFilesDirectory) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("pf_config_paths_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d / "cfg");
  std::ofstream(d / "cfg" / "c.toml") << "[model]\npreset = \"bert-tiny\"\nlayers = 3\n[data]\ntrain_file = \"../t/x.bin\"\n"
                                      << "valid_file = \"/abs/v.bin\"\n[train]\nout_dir = \"out\"\n";
  const Config c = Config::load((d / "cfg" / "c.toml").string(), {"train.checkpoint_dir=ck"});
  EXPECT_EQ(c.data.train_file, (d / "t" / "x.bin").string());
  EXPECT_EQ(c.data.valid_file, "/abs/v.bin");
  EXPECT_EQ(c.train.out_dir, (d / "cfg" / "out").string());
  EXPECT_EQ(c.train.checkpoint_dir, (std::filesystem::current_path() / "ck").string());
  EXPECT_EQ(c.model.layers, 3);
  const Config m = Config::load((d / "cfg" / "c.toml").string(), {"model.preset = \"bert-mini\""});
  EXPECT_EQ(m.model.layers, 4);
  EXPECT_EQ(m.model.hidden, 256);
  std::filesystem::remove_all(d);
}

TEST(Config, BadInputNamesTheKey) {
  EXPECT_EQ(error_of("[model]\nlayerz = 2\n"), "model.layerz: unknown configuration key (did you mean model.layers?)");
  EXPECT_EQ(error_of("", {"modle.layers=2"}), "modle: unknown configuration table (did you mean [model]?)");
  EXPECT_EQ(error_of("", {"model.hidden=0"}), "model.hidden: must be positive (got 0)");
  EXPECT_EQ(error_of("", {"model.logit_chunk_rows=0"}), "model.logit_chunk_rows: must be from 1 to 1048576 (got 0)");
  EXPECT_EQ(error_of("", {"model.logit_chunk_rows=2000000"}),
            "model.logit_chunk_rows: must be from 1 to 1048576 (got 2000000)");
  EXPECT_EQ(error_of("", {"model.hidden=100", "model.heads=3"}),
            "model.hidden: 100 is not divisible by model.heads = 3");
  EXPECT_EQ(error_of("", {"model.layers=two"}), "model.layers: expected an integer");
  EXPECT_EQ(error_of("", {"optim.name=adam"}),
            "optim.name: 'adam' is not one of nvlamb, adamw, sgd, soap (did you mean adamw?)");
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

// kfac.placement = replay follows kfac.refresh_record in one process: both round-trip, and each
// is refused without the other, with a pipeline or replicas, and with a factor EMA.
TEST(Config, ReplayKeys) {
  const Config a = Config::from_toml_string("", {"kfac.enabled=true", "kfac.placement=replay",
                                                 "kfac.refresh_record=/tmp/r.json"});
  EXPECT_EQ(a.kfac.placement, pf::Placement::Replay);
  const Config b = Config::from_toml_string(a.to_toml());
  EXPECT_TRUE(b == a) << b.to_toml();
  EXPECT_EQ(error_of("", {"kfac.refresh_record=/tmp/r.json", "kfac.enabled=true"}),
            "precond.refresh_record: only applies with kfac.enabled = true and precond.placement = replay");
  EXPECT_EQ(error_of("", {"kfac.enabled=true", "kfac.placement=replay"})
                .rfind("precond.refresh_record: precond.placement = replay", 0),
            0u);
  const std::vector<std::string> replay = {"kfac.enabled=true", "kfac.placement=replay",
                                           "kfac.refresh_record=/tmp/r.json"};
  auto with = [&](const std::string& set) {
    std::vector<std::string> v = replay;
    v.push_back(set);
    return v;
  };
  EXPECT_EQ(error_of("", with("parallel.stages=2")).rfind("kfac.placement: 'replay' is one process", 0), 0u);
  EXPECT_EQ(error_of("", with("parallel.data_parallel=2")).rfind("kfac.placement: 'replay' is one process", 0), 0u);
  EXPECT_EQ(error_of("", with("kfac.ema=0.5")).rfind("kfac.ema: must be 0 with kfac.placement = replay", 0), 0u);
}

// data.nsp (BERT's next-sentence prediction, off by default) reaches the model, round-trips, and
// is refused where it cannot apply; kfac.plan_profile only with K-FAC or SOAP in the bubbles.
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
            "kfac.plan_profile: only applies with precond.placement = bubbles or adaptive (and kfac.enabled = true or "
            "optim.name = soap)");
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

// The refresh cycles' bounds: kfac.min_refresh_steps for both PipeFisher placements,
// kfac.max_refresh_steps for adaptive's re-plans; each round-trips and is refused, naming itself,
// out of range or where it cannot apply.
// SOAP's keys (optim.soap.*): defaults, a [optim.soap] table or dotted keys, the round trip
// through config.toml, their bounds, and SOAP refused beside K-FAC naming both keys.
TEST(Config, SoapKeys) {
  const Config d = Config::from_toml_string("");
  EXPECT_EQ(d.optim.soap.shampoo_beta, 0.95);
  EXPECT_EQ(d.optim.soap.precondition_frequency, 10);
  EXPECT_EQ(d.optim.soap.max_precond_dim, 10000);
  const Config a = Config::from_toml_string("[optim]\nname = \"soap\"\n[optim.soap]\nshampoo_beta = 0.9\n",
                                            {"optim.soap.precondition_frequency=4"});
  EXPECT_EQ(a.optim.name, pf::OptimName::Soap);
  EXPECT_EQ(a.optim.soap.shampoo_beta, 0.9);
  EXPECT_EQ(a.optim.soap.precondition_frequency, 4);
  const Config b = Config::from_toml_string(a.to_toml());
  EXPECT_TRUE(b == a) << a.to_toml();
  // SOAP's work stays in its optimizer step unless a placement is asked for; the banner says where.
  EXPECT_EQ(a.kfac.placement, pf::Placement::Inline);
  EXPECT_EQ(pf::optimizer_of(a), "soap");
  const Config bubbles = Config::from_toml_string("", {"optim.name=soap", "parallel.stages=2", "kfac.placement=bubbles"});
  EXPECT_EQ(bubbles.kfac.placement, pf::Placement::Bubbles);
  EXPECT_EQ(pf::optimizer_of(bubbles), "soap (its statistics and eigenbasis refreshes in the pipeline bubbles)");
  EXPECT_EQ(Config::from_toml_string("[optim]\nsoap.max_precond_dim = 512\n").optim.soap.max_precond_dim, 512);
  EXPECT_EQ(error_of("", {"optim.soap.shampoo_beta=-0.1"}), "optim.soap.shampoo_beta: must be in [0, 1) (got -0.1)");
  EXPECT_EQ(error_of("", {"optim.soap.precondition_frequency=0"}),
            "optim.soap.precondition_frequency: must be positive (got 0)");
  EXPECT_EQ(error_of("", {"optim.soap.max_precond_dim=0"}), "optim.soap.max_precond_dim: must be positive (got 0)");
  EXPECT_EQ(error_of("[optim.soap]\nshampo_beta = 0.9\n"),
            "optim.soap.shampo_beta: unknown configuration key (did you mean optim.soap.shampoo_beta?)");
  EXPECT_EQ(error_of("", {"optim.name=soap", "kfac.enabled=true"}),
            "optim.name: soap does not run with kfac.enabled = true: SOAP preconditions the Linear weights itself "
            "(set kfac.enabled = false, or another optim.name)");
}

// In the bubbles every rotated weight keeps its gradient for the next step's STAT (one step late):
// the estimate counts one more float per entry of each Linear weight (BERT: per block Q, K, V, O
// and the two FFN matrices; the pooler, the head's transform and the next-sentence classifier).
TEST(Config, SoapInTheBubblesCountsTheGradientsKeptForTheStatistics) {
  const Config in = Config::from_toml_string("", {"optim.name=soap", "parallel.stages=2", "parallel.data_parallel=1"});
  const Config bubbles = Config::from_toml_string(
      "", {"optim.name=soap", "parallel.stages=2", "parallel.data_parallel=1", "kfac.placement=bubbles"});
  const pf::ModelConfig& m = in.model;
  ASSERT_EQ(m.arch, pf::Arch::Bert);
  const double C = m.hidden, F = m.ffn;
  const double linear_entries = m.layers * (4 * C * C + 2 * C * F) + 2 * C * C + 2 * C;
  EXPECT_DOUBLE_EQ(pf::estimate_run_bytes(bubbles) - pf::estimate_run_bytes(in), 4 * linear_entries);
}

TEST(Config, RefreshStepBounds) {
  const std::vector<std::string> adaptive = {"kfac.enabled=true", "parallel.stages=2", "kfac.placement=adaptive"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.begin(), adaptive.begin(), adaptive.end());
    return sets;
  };
  Config d = Config::from_toml_string("");
  EXPECT_EQ(d.kfac.min_refresh_steps, 1);
  EXPECT_EQ(d.kfac.max_refresh_steps, 0);
  Config a = Config::from_toml_string("", with({"kfac.min_refresh_steps=2", "kfac.max_refresh_steps=8"}));
  Config b = Config::from_toml_string(a.to_toml());
  EXPECT_EQ(b.kfac.min_refresh_steps, 2);
  EXPECT_EQ(b.kfac.max_refresh_steps, 8);
  EXPECT_EQ(error_of("", with({"precond.min_refresh_steps=0"})),
            "precond.min_refresh_steps: must be between 1 and 1000 (got 0)");
  EXPECT_EQ(error_of("", with({"kfac.max_refresh_steps=1001"})),
            "precond.max_refresh_steps: must be between 0 (the profiled plan's) and 1000 (got 1001)");
  EXPECT_EQ(error_of("", with({"kfac.min_refresh_steps=4", "kfac.max_refresh_steps=3"})),
            "kfac.max_refresh_steps: must be 0 or at least kfac.min_refresh_steps = 4 (got 3)");
  EXPECT_EQ(error_of("", {"kfac.enabled=true", "parallel.stages=2", "kfac.max_refresh_steps=3"}),
            "kfac.max_refresh_steps: only applies with kfac.enabled = true and kfac.placement = adaptive");
  EXPECT_EQ(error_of("", {"kfac.min_refresh_steps=3"}),
            "precond.min_refresh_steps: only applies with precond.placement = bubbles or adaptive (and kfac.enabled = "
            "true or optim.name = soap)");
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
  EXPECT_EQ(Config::from_toml_string("", {"kfac.enabled=true"}).kfac.placement, pf::Placement::Inline);
  EXPECT_EQ(Config::from_toml_string("", {"kfac.enabled=true", "parallel.stages=2"}).kfac.placement, pf::Placement::Bubbles);
  EXPECT_EQ(Config::from_toml_string("", {"kfac.placement=\"bubbles\""}).kfac.placement, pf::Placement::Bubbles);
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

namespace {
// parse_name(name_of(v)) == v for every value of a setting, and its names are listed in table order.
template <typename E>
void expect_names_round_trip(const std::string& listed) {
  std::string list;
  for (const auto& n : pf::EnumNames<E>::table) {
    EXPECT_EQ(pf::parse_name<E>(pf::name_of(n.value)), n.value) << n.name;
    EXPECT_EQ(pf::name_of(n.value), n.name);
    EXPECT_EQ(fmt::format("{}", n.value), n.name);
    list += (list.empty() ? "" : ", ") + std::string(n.name);
  }
  EXPECT_EQ(pf::names_of<E>(), listed);
  EXPECT_EQ(list, listed);
  EXPECT_FALSE(pf::parse_name<E>("no-such-name"));
}
}  // namespace

TEST(Config, EachSettingsNamesRoundTrip) {
  expect_names_round_trip<pf::Arch>("bert, gpt, llama");
  expect_names_round_trip<pf::Gelu>("erf, tanh");
  expect_names_round_trip<pf::Vocab>("bert, gpt2");
  expect_names_round_trip<pf::OptimName>("nvlamb, adamw, sgd, soap");
  expect_names_round_trip<pf::OnNonfinite>("skip, stop");
  expect_names_round_trip<pf::ScheduleName>("naive, gpipe, 1f1b, interleaved, chimera, zb-h1, zb-h2, zb-auto, zb-v");
  expect_names_round_trip<pf::Placement>("bubbles, inline, skip, replay, adaptive");
  expect_names_round_trip<pf::KfacStrategy>("d-kfac, mpd-kfac, spd-kfac");
  // JSON writes a setting by its name, not its integer.
  EXPECT_EQ(nlohmann::json(pf::Placement::Skip).dump(), "\"skip\"");
  EXPECT_EQ(nlohmann::json({{"arch", pf::Arch::Gpt}}).dump(), "{\"arch\":\"gpt\"}");
}

TEST(Config, AnUnknownSettingNameIsRefusedNamingTheKey) {
  EXPECT_EQ(error_of("", {"kfac.placement=bubble"}),
            "kfac.placement: 'bubble' is not one of bubbles, inline, skip, replay, adaptive (did you mean bubbles?)");
  EXPECT_EQ(error_of("[parallel]\nschedule = \"pipedream\"\n"),
            "parallel.schedule: 'pipedream' is not one of naive, gpipe, 1f1b, interleaved, chimera, zb-h1, zb-h2, zb-auto, zb-v");
  EXPECT_EQ(error_of("", {"kfac.distributed=spd"}), "kfac.distributed: 'spd' is not one of d-kfac, mpd-kfac, spd-kfac");
  EXPECT_EQ(error_of("", {"model.arch=t5"}), "model.arch: 't5' is not one of bert, gpt, llama");
  EXPECT_EQ(error_of("", {"model.gelu=relu"}), "model.gelu: 'relu' is not one of erf, tanh");
  EXPECT_EQ(error_of("", {"data.vocab=gpt"}), "data.vocab: 'gpt' is not one of bert, gpt2 (did you mean gpt2?)");
  EXPECT_EQ(error_of("", {"train.on_nonfinite=ignore"}), "train.on_nonfinite: must be 'skip' or 'stop' (got 'ignore')");
  EXPECT_EQ(error_of("", {"kfac.placement=3"}), "kfac.placement: expected a string");
  // An empty model.gelu is the architecture's own.
  EXPECT_EQ(Config::from_toml_string("", {"model.arch=gpt", "model.gelu=\"\""}).model.gelu, pf::Gelu::Tanh);
}

// Each key is declared once: config.toml holds every one exactly once, in its table, and reads
// back to the same Config.
TEST(Config, EveryKeyPrintsOnceAndReadsBackEqual) {
  const Config a = Config::from_toml_string(
      "", {"model.preset=gpt2-tiny", "model.dropout=0.1", "data.nsp=false", "optim.name=sgd", "optim.lr=3e-4",
           "optim.schedule=cosine", "optim.min_lr=3e-5", "train.on_nonfinite=stop", "train.seed=7",
           "parallel.stages=2", "parallel.schedule=chimera", "parallel.partition=[1,1]", "kfac.enabled=true", "kfac.placement=skip", "kfac.distributed=d-kfac",
           "kfac.spd_pipelining=true", "kfac.ema=0.5", "kfac.warmup_steps=3"});
  const std::string toml = a.to_toml();
  const std::vector<std::string> keys = pf::config_keys();
  EXPECT_EQ(keys.size(), 82u);
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
  std::map<std::string, int> printed;
  std::string table;
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.front() == '[') table = line.substr(1, line.size() - 2);
    else ++printed[table + "." + line.substr(0, line.find(" = "))];
  }
  EXPECT_EQ(printed.size(), keys.size()) << toml;
  for (const std::string& k : keys) EXPECT_EQ(printed[k], 1) << k << " in\n" << toml;
  const Config b = Config::from_toml_string(toml);
  EXPECT_TRUE(b == a) << b.to_toml();
  EXPECT_EQ(b.parallel.schedule, pf::ScheduleName::Chimera);
  EXPECT_EQ(b.kfac.distributed, pf::KfacStrategy::DKfac);
  EXPECT_EQ(b.train.on_nonfinite, pf::OnNonfinite::Stop);
  EXPECT_TRUE(Config::from_toml_string(Config::from_toml_string("").to_toml()) == Config::from_toml_string(""));
}

// parallel.data_parallel = auto (the default) is the world's size over the stages, as torchtitan
// and Megatron take it: written as the word, held as kAutoDataParallel until the run knows its
// world, then a number; a world the stages do not divide is refused naming both numbers.
TEST(Config, DataParallelAutoIsTheWorldOverTheStages) {
  const Config d = Config::from_toml_string("");
  EXPECT_EQ(d.parallel.data_parallel, pf::kAutoDataParallel);
  EXPECT_NE(d.to_toml().find("data_parallel = 'auto'\n"), std::string::npos) << d.to_toml();
  EXPECT_EQ(Config::from_toml_string(d.to_toml()), d);  // config.toml reads back
  EXPECT_EQ(Config::from_toml_string("", {"parallel.data_parallel=3"}).parallel.data_parallel, 3);
  EXPECT_EQ(Config::from_toml_string("", {"parallel.data_parallel=auto"}).parallel.data_parallel, pf::kAutoDataParallel);
  EXPECT_EQ(error_of("", {"parallel.data_parallel=0"}), "parallel.data_parallel: must be a positive integer or 'auto' (got 0)");
  EXPECT_EQ(error_of("", {"parallel.data_parallel=-2"}), "parallel.data_parallel: must be a positive integer or 'auto' (got -2)");
  EXPECT_EQ(error_of("", {"parallel.data_parallel=two"}), "parallel.data_parallel: expected an integer or 'auto'");
  EXPECT_EQ(error_of("", {"parallel.data_parallel=1.5"}), "parallel.data_parallel: expected an integer or 'auto'");

  auto resolved = [](const std::vector<std::string>& sets, int world) {
    Config c = Config::from_toml_string("", sets);
    pf::resolve_data_parallel(c, world);
    return c.parallel.data_parallel;
  };
  EXPECT_EQ(resolved({"parallel.stages=2"}, 2), 1);
  EXPECT_EQ(resolved({"parallel.stages=2"}, 8), 4);
  EXPECT_EQ(resolved({}, 3), 3);
  EXPECT_EQ(resolved({"parallel.stages=2", "parallel.data_parallel=3"}, 4), 3);  // a number is the user's: kept
  try {
    resolved({"parallel.stages=2"}, 3);
    ADD_FAILURE() << "3 ranks over 2 stages must be refused";
  } catch (const pf::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("parallel.stages: the MPI world has 3 ranks, which 2 stages do not divide", 0), 0u)
        << e.what();
  }
  // Keys that depend on the number are checked again once it is one.
  const std::vector<std::string> replay = {"kfac.enabled=true", "kfac.placement=replay", "kfac.refresh_record=/tmp/r.json"};
  EXPECT_EQ(resolved(replay, 1), 1);
  EXPECT_THROW(resolved(replay, 2), pf::UsageError);
}

// The Llama-style model's keys: presets with grouped-query heads, kv_heads = auto as the heads,
// refusals naming the key for what only llama varies or what cannot work.
TEST(Config, LlamaPresetsAndKeys) {
  Config t = Config::from_toml_string("", {"model.preset=llama-tiny"});
  EXPECT_EQ(t.model.arch, pf::Arch::Llama);
  EXPECT_EQ(t.model.heads, 2);
  EXPECT_EQ(t.model.kv_heads, 1);
  EXPECT_EQ(t.model.ffn, 384);
  EXPECT_EQ(t.data.vocab, pf::Vocab::Gpt2);
  EXPECT_FLOAT_EQ(t.model.layer_norm_eps, 1e-5f);
  EXPECT_TRUE(t.model.tie_embeddings);
  EXPECT_EQ(pf::preset_of(t.model), "llama-tiny");
  Config m = Config::from_toml_string("", {"model.preset=llama-mini", "model.tie_embeddings=false", "model.rope_theta=5e5"});
  EXPECT_EQ(m.model.kv_heads, 2);
  EXPECT_FALSE(m.model.tie_embeddings);
  EXPECT_DOUBLE_EQ(m.model.rope_theta, 5e5);
  EXPECT_EQ(Config::from_toml_string(m.to_toml()), m);
  // auto: every head its own keys and values, resolved where the heads are known.
  Config a = Config::from_toml_string("", {"model.arch=llama", "model.heads=8", "model.kv_heads=auto"});
  EXPECT_EQ(a.model.kv_heads, 8);
  EXPECT_EQ(Config::from_toml_string("", {"model.preset=bert-mini", "model.heads=8"}).model.kv_heads, 8);
  EXPECT_NE(error_of("", {"model.preset=llama-mini", "model.kv_heads=3"}).find("model.kv_heads: model.heads = 4 is not divisible by 3"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.arch=gpt", "model.kv_heads=2"}).find("model.kv_heads: 2 differs from model.heads = 4"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.tie_embeddings=false"}).find("model.tie_embeddings: false is llama's"), std::string::npos);
  EXPECT_NE(error_of("", {"model.arch=llama", "model.hidden=12", "model.heads=4"}).find("model.heads: rotary positions"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.arch=llama", "model.rope_theta=0"}).find("model.rope_theta: must be positive"),
            std::string::npos);
  EXPECT_NE(error_of("", {"model.arch=llama", "model.kv_heads=0"}).find("model.kv_heads"), std::string::npos);
  EXPECT_NE(error_of("", {"model.arch=llama", "data.nsp=true"}).find("data.nsp"), std::string::npos);
}
