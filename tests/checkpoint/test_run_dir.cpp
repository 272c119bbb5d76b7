// A run directory is the unit (train/run_dir.hpp): `train --resume RUN/checkpoints` and
// `eval`/`generate --init RUN` read the run's own config.toml, --set overrides it and a shape it
// cannot take is refused naming the key; paths do not depend on the current directory
// (config/paths.hpp): a config file's relative paths resolve against its directory, a run's
// config.toml holds them absolute, and the vocabulary is found beside the token files.
#include "cli.hpp"

#include <algorithm>

namespace {

using namespace pf_test;

fs::path dir() {
  const fs::path d = work_dir("checkpoint") / "rundir";
  fs::create_directories(d);
  return d;
}

std::string sample(const std::string& vocab) {
  return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20." + vocab + ".bin";
}

// bert-tiny's shape on the committed sample, every key on the command line (no --config).
std::string tiny_sets(const std::string& preset = "bert-tiny", const std::string& vocab = "bert") {
  return "--set model.preset=" + preset + " --set model.seq_len=16 --set data.train_file=" + sample(vocab) +
         " --set data.valid_file=" + sample(vocab) +
         " --set train.steps=6 --set train.threads=1 --set train.eval_every=0 --set train.eval_batches=2"
         " --set optim.warmup_steps=1 --set parallel.micro_batches=2 --set parallel.micro_batch_size=2";
}

// The command run from `cwd` (another directory than the test's).
std::string in(const fs::path& cwd, const std::string& args) {
  return "cd " + cwd.string() + " && " + kEnv + kBinary + " " + args;
}

// The last line's JSON, without generate's timings (the wall clock's, not the command's result).
nlohmann::json last_json(const Launch& r) {
  const std::string s = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
  nlohmann::json j = nlohmann::json::parse(s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1));
  j.erase("timings");
  return j;
}

// A 6-step bert-tiny run given by --set alone, checkpointing every 3 steps into RUN/checkpoints.
fs::path tiny_run(const std::string& name) {
  const fs::path run = dir() / name;
  Launch r = pf_test::run(in(dir(), "train " + tiny_sets() + " --set train.checkpoint_every=3 --set train.out_dir=" +
                                        name + " --set train.checkpoint_dir=" + name + "/checkpoints --log-json " +
                                        name + ".jsonl"));
  EXPECT_EQ(r.status, 0) << r.out;
  return run;
}

// Resumed from its checkpoint directory with no --set, from another directory, the run continues
// bit for bit: the same losses and the same final weights.
TEST(RunDir, ResumesWithItsOwnConfiguration) {
  const fs::path run = tiny_run("tiny");
  const std::string weights = slurp(run / "model.safetensors");
  for (const fs::path& resume : {run / "checkpoints", run}) {
    fs::remove_all(run / "checkpoints" / "step-000006");
    Launch r = pf_test::run(in("/", "train --resume " + resume.string() + " --log-json " +
                                        (dir() / "tiny-resumed.jsonl").string()));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "resuming from " + (run / "checkpoints" / "step-000003").string())) << r.out;
    const auto ref = read_log(dir() / "tiny.jsonl"), log = read_log(dir() / "tiny-resumed.jsonl");
    ASSERT_EQ(log.size(), 3u) << resume;
    for (int64_t s = 4; s <= 6; ++s) {
      EXPECT_EQ(log.at(s)["loss"].get<double>(), ref.at(s)["loss"].get<double>()) << resume << " step " << s;
      EXPECT_EQ(log.at(s)["grad_norm"].get<double>(), ref.at(s)["grad_norm"].get<double>()) << resume;
    }
    EXPECT_TRUE(slurp(run / "model.safetensors") == weights) << resume;
  }
}

// --set over the run's configuration: another shape cannot resume (one line naming the key, exit
// 2); --set model.preset brings that preset's sizes, not the run's.
TEST(RunDir, ResumeRefusesAnotherShapeNamingTheKey) {
  const fs::path run = tiny_run("tiny-refuse");
  for (const std::string& set : {"model.layers=3", "model.preset=bert-mini"}) {
    Launch r = pf_test::run(in("/", "train --resume " + (run / "checkpoints").string() + " --set " + set));
    EXPECT_EQ(r.status, 2) << set << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("pipefisher: model.layers: the checkpoint at step 6 was written with model.layers = 2", 0),
              0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

// eval --init RUN (from anywhere) equals eval with the explicit configuration and weights file;
// --init RUN/model.safetensors reads the config.toml beside it; --set still overrides.
TEST(RunDir, EvalReadsTheRunsConfiguration) {
  const fs::path run = tiny_run("tiny-eval");
  const std::string file = (run / "model.safetensors").string();
  Launch explicit_flags = pf_test::run(in(dir(), "eval " + tiny_sets() + " --init " + file + " --json"));
  ASSERT_EQ(explicit_flags.status, 0) << explicit_flags.out;
  const double loss = last_json(explicit_flags).at("loss").get<double>();
  for (const std::string& args : {"--init " + run.string(), "--init " + file,
                                  "--config " + (run / "config.toml").string() + " --init " + file}) {
    Launch r = pf_test::run(in("/", "eval " + args + " --json"));
    ASSERT_EQ(r.status, 0) << args << "\n" << r.out;
    EXPECT_EQ(last_json(r).at("loss").get<double>(), loss) << args;
    EXPECT_EQ(last_json(r).at("sequences").get<int>(), 2 * 2) << args;
  }
  Launch fewer = pf_test::run(in("/", "eval --init " + run.string() + " --set train.eval_batches=1 --json"));
  ASSERT_EQ(fewer.status, 0) << fewer.out;
  EXPECT_EQ(last_json(fewer).at("sequences").get<int>(), 2);
}

// --init accepts a Hugging Face model folder (model.safetensors and config.json, no config.toml),
// taking the model's shape from config.json as from_pretrained does: the run's own weights in such
// a folder score as the run does, under a configuration of another shape (the built-in bert-mini)
// and under a config.json transformers would write (more fields, its own order). A model we do
// not train is refused naming the file and the field.
TEST(RunDir, InitTakesAHuggingFaceFolderWithItsShape) {
  const fs::path run = tiny_run("tiny-hf");
  const std::string data = " --set data.valid_file=" + sample("bert") + " --set train.eval_batches=2"
                           " --set parallel.micro_batch_size=2 --set model.seq_len=16 --json";
  Launch own = pf_test::run(in("/", "eval --init " + run.string() + " --json"));
  ASSERT_EQ(own.status, 0) << own.out;
  const double loss = last_json(own).at("loss").get<double>();
  const fs::path hf = dir() / "hf-folder";
  fs::create_directories(hf);
  fs::copy_file(run / "model.safetensors", hf / "model.safetensors", fs::copy_options::overwrite_existing);
  fs::copy_file(run / "config.json", hf / "config.json", fs::copy_options::overwrite_existing);
  Launch ours = pf_test::run(in("/", "eval --init " + hf.string() + data));
  ASSERT_EQ(ours.status, 0) << ours.out;
  EXPECT_EQ(last_json(ours).at("loss").get<double>(), loss);
  // bert-tiny's config.json as transformers writes it (BertConfig.to_json_string).
  std::ofstream(hf / "config.json")
      << R"({"_name_or_path": "prajjwal1/bert-tiny", "architectures": ["BertForPreTraining"],
           "attention_probs_dropout_prob": 0.1, "classifier_dropout": null, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.0, "hidden_size": 128, "initializer_range": 0.02,
           "intermediate_size": 512, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
           "model_type": "bert", "num_attention_heads": 2, "num_hidden_layers": 2, "pad_token_id": 0,
           "position_embedding_type": "absolute", "torch_dtype": "float32", "transformers_version": "4.35.2",
           "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})";
  Launch theirs = pf_test::run(in("/", "eval --init " + hf.string() + data));
  ASSERT_EQ(theirs.status, 0) << theirs.out;
  EXPECT_EQ(last_json(theirs).at("loss").get<double>(), loss);
  // Training from the folder: its shape, not the configuration's.
  Launch train = pf_test::run(in(dir(), "train --init " + hf.string() + " --print-config"));  // the default: bert-mini
  ASSERT_EQ(train.status, 0) << train.out;
  EXPECT_TRUE(contains(train.out, "hidden = 128\n")) << train.out;
  std::ofstream(hf / "config.json") << R"({"model_type": "roberta", "hidden_size": 128})";
  Launch roberta = pf_test::run(in("/", "eval --init " + hf.string() + data));
  EXPECT_EQ(roberta.status, 2) << roberta.out;
  EXPECT_EQ(roberta.out, "pipefisher: --init: '" + (hf / "config.json").string() +
                             "': model_type 'roberta' is not one we train (bert, gpt2, llama)\n");
}

// A config file in another directory names its data, out_dir and log relative to itself; trained
// from a third directory, everything lands beside the file and config.toml holds absolute paths.
// --set's relative paths resolve against the current directory.
TEST(RunDir, ConfigPathsResolveAgainstTheConfigFile) {
  const fs::path base = dir() / "paths", cfgdir = base / "configs", cwd = base / "elsewhere";
  fs::create_directories(base / "tokens");
  fs::create_directories(cfgdir);
  fs::create_directories(cwd);
  fs::copy_file(sample("bert"), base / "tokens" / "t.bin", fs::copy_options::overwrite_existing);
  std::ofstream(cfgdir / "tiny.toml") << "[model]\npreset = \"bert-tiny\"\nseq_len = 16\n"
                                      << "[data]\ntrain_file = \"../tokens/t.bin\"\nvalid_file = \"../tokens/t.bin\"\n"
                                      << "[train]\nsteps = 2\nthreads = 1\neval_every = 0\neval_batches = 1\n"
                                      << "out_dir = \"../runs/tiny\"\nlog_json = \"steps.jsonl\"\n"
                                      << "[parallel]\nmicro_batches = 1\nmicro_batch_size = 2\n";
  Launch r = pf_test::run(in(cwd, "train --config ../configs/tiny.toml"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(base / "runs" / "tiny" / "model.safetensors")) << r.out;
  EXPECT_TRUE(fs::exists(cfgdir / "steps.jsonl")) << r.out;
  const std::string toml = slurp(base / "runs" / "tiny" / "config.toml");
  EXPECT_TRUE(contains(toml, "train_file = '" + (base / "tokens" / "t.bin").string() + "'")) << toml;
  EXPECT_TRUE(contains(toml, "out_dir = '" + (base / "runs" / "tiny").string() + "'")) << toml;
  Launch set = pf_test::run(in(cwd, "train --config ../configs/tiny.toml --set train.out_dir=mine --print-config"));
  ASSERT_EQ(set.status, 0) << set.out;
  EXPECT_TRUE(contains(set.out, "out_dir = '" + (cwd / "mine").string() + "'")) << set.out;
  // The built-in default job from elsewhere: the token files of the program's source tree
  // (build/pipefisher -> data/corpus) when they are there, its out_dir in the current directory.
  Launch defaults = pf_test::run(in(cwd, "train --print-config"));
  ASSERT_EQ(defaults.status, 0) << defaults.out;
  const fs::path tree = fs::canonical(kBinary).parent_path().parent_path() / "data" / "corpus" / "train.bert.bin";
  const fs::path train = fs::exists(tree) ? tree : cwd / "data" / "corpus" / "train.bert.bin";
  EXPECT_TRUE(contains(defaults.out, "train_file = '" + train.string() + "'")) << defaults.out;
  EXPECT_TRUE(contains(defaults.out, "out_dir = '" + (cwd / "runs" / "default").string() + "'")) << defaults.out;
}

// generate --init RUN from another directory finds the GPT-2 vocabulary beside the run's token
// files (data/sample -> data/vocab); where there is none, the refusal names every directory tried.
TEST(RunDir, GenerateFindsTheVocabulary) {
  const fs::path run = dir() / "gpt";
  Launch t = pf_test::run(in(dir(), "train " + tiny_sets("gpt2-tiny", "gpt2") + " --steps 1 --set train.out_dir=gpt"));
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string gen = "generate --prompt 'Call me' --max-new-tokens 4 --temperature 0 --json --init " + run.string();
  Launch named = pf_test::run(in(dir(), gen + " --vocab-dir " PF_SOURCE_DIR "/data/vocab"));
  ASSERT_EQ(named.status, 0) << named.out;
  Launch found = pf_test::run(in("/", gen));
  ASSERT_EQ(found.status, 0) << found.out;
  EXPECT_EQ(last_json(found), last_json(named));
  // A copy of the program away from the source tree, a run whose token file has no vocabulary
  // near: it finds the vocabulary of the source tree it was built from (issue 34).
  const fs::path away = dir() / "away";
  fs::create_directories(away / "bin");
  fs::create_directories(away / "tokens");
  fs::copy_file(kBinary, away / "bin" / "pipefisher", fs::copy_options::overwrite_existing);
  fs::copy_file(sample("gpt2"), away / "tokens" / "t.bin", fs::copy_options::overwrite_existing);
  Launch copy = pf_test::run("cd " + away.string() + " && " + kEnv + "bin/pipefisher " + gen +
                             " --set data.valid_file=tokens/t.bin");
  ASSERT_EQ(copy.status, 0) << copy.out;
  EXPECT_EQ(last_json(copy), last_json(named));
}

}  // namespace
