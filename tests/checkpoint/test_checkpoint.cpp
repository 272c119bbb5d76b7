// Checkpoints: SHA-256 against the standard's vectors; the on-disk protocol (manifest, checksums,
// latest, retention, incomplete checkpoints); malformed manifests refused; the trainer's state
// (weights, optimizer, K-FAC) restored exactly; `train --resume` bit-identical to an uninterrupted
// run, in one process and in a 2-rank pipeline; a 2- or 4-stage checkpoint loaded by name into one
// process.
#include "cli.hpp"

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "nn/model.hpp"
#include "train/checkpointing.hpp"
#include "train/trainer.hpp"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("checkpoint"); }

// --- SHA-256 ---

TEST(Sha256, StandardVectors) {
  // FIPS 180-2 appendix B and the empty message.
  EXPECT_EQ(pf::sha256_hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(pf::sha256_hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(pf::sha256_hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(pf::sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // A file hashed in 1 MiB reads gives the same digest as the bytes.
  const fs::path f = dir() / "million.txt";
  std::ofstream(f, std::ios::binary) << million << "tail";
  EXPECT_EQ(pf::sha256_file(f.string()), pf::sha256_hex(million + "tail"));
  EXPECT_THROW(pf::sha256_file((dir() / "absent").string()), pf::UsageError);
}

// --- the on-disk protocol ---

// A checkpoint of one tensor "w" = {v, v+1, v+2} at `step` under d.
pf::CheckpointManifest write_one(const fs::path& d, int64_t step, float v, int keep) {
  const std::string sd = pf::checkpoint_step_dir(d.string(), step);
  fs::create_directories(sd);
  std::vector<float> w{v, v + 1, v + 2};
  pf::CheckpointManifest m{step, {{"train.seed", "42"}}, {}};
  m.files.push_back(pf::write_checkpoint_tensors(sd, "weights-stage-0.safetensors", {{"w", {3}, w}}));
  pf::commit_checkpoint(d.string(), m, keep);
  return m;
}

TEST(CheckpointFiles, ManifestLatestAndRetention) {
  const fs::path d = dir() / "proto";
  write_one(d, 1, 1.0f, 2);
  write_one(d, 2, 2.0f, 2);
  write_one(d, 3, 3.0f, 2);
  // Keep 2: step 1 is gone, 2 and 3 remain, latest names 3.
  EXPECT_FALSE(fs::exists(d / "step-000001"));
  EXPECT_TRUE(fs::exists(d / "step-000002" / "manifest.json"));
  EXPECT_EQ(slurp(d / "latest"), "step-000003\n");
  EXPECT_EQ(pf::find_latest_checkpoint(d.string()), (d / "step-000003").string());

  pf::CheckpointReader r((d / "step-000003").string());
  EXPECT_EQ(r.manifest().step, 3);
  EXPECT_EQ(r.manifest().info.at("train.seed"), "42");
  std::vector<float> w(3);
  r.read("w", {3}, w);
  EXPECT_EQ(w, (std::vector<float>{3, 4, 5}));
  std::vector<float> four(4);
  EXPECT_THROW(r.read("w", {4}, four), pf::UsageError);  // wrong shape
  EXPECT_THROW(r.read("v", {3}, w), pf::UsageError);                        // absent
  // The manifest's checksum is the file's.
  EXPECT_EQ(r.manifest().files.at(0).sha256, pf::sha256_file((d / "step-000003" / "weights-stage-0.safetensors").string()));
}

TEST(CheckpointFiles, CorruptOrIncompleteCheckpointsAreSkipped) {
  const fs::path d = dir() / "corrupt";
  write_one(d, 1, 1.0f, 3);
  write_one(d, 2, 2.0f, 3);
  // Flip one byte of step 2's data: its checksum fails, so `latest` (step 2) is passed over.
  const fs::path f = d / "step-000002" / "weights-stage-0.safetensors";
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(-1, std::ios::end);
    s.put('\x7f');
  }
  try {
    pf::read_checkpoint((d / "step-000002").string());
    ADD_FAILURE() << "corrupt file accepted";
  } catch (const pf::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "checksum")) << e.what();
  }
  EXPECT_EQ(pf::find_latest_checkpoint(d.string()), (d / "step-000001").string());
  // A newer directory without a manifest (a writer killed before committing) is not complete.
  fs::create_directories(d / "step-000003");
  std::ofstream(d / "step-000003" / "weights-stage-0.safetensors") << "partial";
  EXPECT_EQ(pf::find_latest_checkpoint(d.string()), (d / "step-000001").string());
  // Truncated file: the size check catches it before the checksum.
  fs::resize_file(d / "step-000001" / "weights-stage-0.safetensors", 10);
  try {
    pf::find_latest_checkpoint(d.string());
    ADD_FAILURE() << "no complete checkpoint left, yet one was found";
  } catch (const pf::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "--resume: no complete checkpoint")) << e.what();
  }
  EXPECT_THROW(pf::find_latest_checkpoint((dir() / "no-such-dir").string()), pf::UsageError);
}

TEST(CheckpointFiles, MalformedManifestsAreRefused) {
  const std::string sha(64, 'a');
  auto manifest = [&](const std::string& files, const std::string& head = R"("format": "pipefisher-checkpoint", "version": 1, "step": 5)") {
    return "{" + head + ", \"files\": " + files + "}";
  };
  const std::string good = manifest(R"([{"name": "a.safetensors", "bytes": 10, "sha256": ")" + sha + "\"}]");
  const pf::CheckpointManifest m = pf::parse_checkpoint_manifest(good, "m");
  EXPECT_EQ(m.step, 5);
  ASSERT_EQ(m.files.size(), 1u);
  EXPECT_EQ(m.files[0].bytes, 10u);
  const std::vector<std::string> bad = {
      "",
      "{",
      "[]",
      manifest("[]"),
      manifest(R"([{"name": "../x", "bytes": 1, "sha256": ")" + sha + "\"}]"),
      manifest(R"([{"name": "/etc/passwd", "bytes": 1, "sha256": ")" + sha + "\"}]"),
      manifest(R"([{"name": "manifest.json", "bytes": 1, "sha256": ")" + sha + "\"}]"),
      manifest(R"([{"name": "a", "bytes": -1, "sha256": ")" + sha + "\"}]"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": "xyz"}])"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + std::string(64, 'A') + "\"}]"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + sha + R"("}, {"name": "a", "bytes": 1, "sha256": ")" + sha + "\"}]"),
      manifest(R"([{"name": "a", "bytes": 1}])"),
      manifest("[1]"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + sha + "\"}]", R"("format": "other", "version": 1, "step": 5)"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + sha + "\"}]", R"("format": "pipefisher-checkpoint", "version": 2, "step": 5)"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + sha + "\"}]", R"("format": "pipefisher-checkpoint", "version": 1, "step": -5)"),
      manifest(R"([{"name": "a", "bytes": 1, "sha256": ")" + sha + "\"}]", R"("format": "pipefisher-checkpoint", "version": 1, "step": 5, "info": {"k": 1})"),
  };
  for (const std::string& text : bad) EXPECT_THROW(pf::parse_checkpoint_manifest(text, "m"), pf::UsageError) << text;
}

// --- the trainer's state, restored exactly ---

pf::Config tiny_kfac_config() {
  pf::Config c = pf::Config::load(tiny_config(dir()).string(),
                                  {"optim.name=adamw", "kfac.enabled=true", "kfac.placement=inline", "kfac.ema=0.5",
                                   "kfac.inverse_every=2", "train.out_dir=" + (dir() / "unused").string()});
  return c;
}

TEST(TrainerState, SavedAndRestoredBitForBit) {
  pf::Config cfg = tiny_kfac_config();
  pf::Trainer a(cfg);
  for (int s = 0; s < 3; ++s) a.step();
  const std::string sd = pf::checkpoint_step_dir((dir() / "trainer").string(), 3);
  fs::create_directories(sd);
  pf::CheckpointManifest m{3, pf::checkpoint_info(cfg, 3, "1 process"), pf::write_stage_state(sd, 0, a.state())};
  pf::commit_checkpoint((dir() / "trainer").string(), m, 2);

  pf::Trainer b(cfg);  // fresh: different optimizer state, no K-FAC factors
  pf::CheckpointReader r(sd);
  pf::load_train_state(r, b.state());
  b.set_step_index(r.manifest().step);
  EXPECT_EQ(b.optimizer().step_count(), 3);
  auto sa = a.optimizer().state_tensors(), sb = b.optimizer().state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    ASSERT_EQ(std::memcmp(sa[i].second->data(), sb[i].second->data(), sa[i].second->numel() * sizeof(float)), 0) << sa[i].first;
  const pf::NamedTensors ka = a.kfac()->state(), kb = b.kfac()->state();
  ASSERT_EQ(ka.size(), kb.size());
  ASSERT_GT(ka.size(), 0u);
  for (size_t i = 0; i < ka.size(); ++i)
    ASSERT_EQ(std::memcmp(ka[i].second.data(), kb[i].second.data(), ka[i].second.numel() * sizeof(float)), 0) << ka[i].first;
  // The next steps (a curvature step and, at 4, an inversion step) agree to the bit.
  for (int s = 0; s < 2; ++s) {
    const pf::StepStats x = a.step(), y = b.step();
    EXPECT_EQ(x.loss, y.loss);
    EXPECT_EQ(x.grad_norm, y.grad_norm);
    EXPECT_EQ(x.kfac_inversion, y.kfac_inversion);
  }
  // A configuration with another seed is refused, naming the key.
  pf::Config other = cfg;
  other.train.seed = 7;
  try {
    pf::check_resume(other, r.manifest());
    ADD_FAILURE() << "seed mismatch accepted";
  } catch (const pf::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "train.seed")) << e.what();
  }
}

// --- `pipefisher train --resume` ---

// Runs 6 steps checkpointing every 3, drops the step-6 checkpoint (so `latest` names a missing
// one and the scan finds step 3), resumes, and expects steps 4..6 bit-identical to `reference`.
void expect_resume_identical(const std::string& name, int np, const std::string& sets,
                             const std::map<int64_t, nlohmann::json>& reference) {
  const fs::path ck = dir() / (name + "-ckpt");
  const std::string ckset = " --set train.checkpoint_dir=" + ck.string() + " --set train.checkpoint_every=3 " + sets;
  auto cmd = [&](const std::string& n, const std::string& extra) {
    return np == 1 ? train_cmd(dir(), n, ckset + extra) : mpi_train_cmd(np, dir(), n, ckset + extra);
  };
  Launch first = run(cmd(name + "-first", ""));
  ASSERT_EQ(first.status, 0) << first.out;
  ASSERT_TRUE(fs::exists(ck / "step-000003" / "manifest.json"));
  ASSERT_TRUE(fs::exists(ck / "step-000006" / "manifest.json"));
  fs::remove_all(ck / "step-000006");
  // Another run directory: its own checkpoint directory (ck belongs to the first run's).
  Launch resumed = run(cmd(name + "-resumed", " --resume " + ck.string() + " --set train.checkpoint_dir=" + ck.string() +
                                                 "-resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "resuming from " + (ck / "step-000003").string() + " (step 3)")) << resumed.out;
  const auto log = read_log(dir() / (name + "-resumed.jsonl"));
  ASSERT_EQ(log.size(), 3u);
  for (int64_t s = 4; s <= 6; ++s) {
    EXPECT_EQ(log.at(s)["loss"].get<double>(), reference.at(s)["loss"].get<double>()) << name << " step " << s;
    EXPECT_EQ(log.at(s)["grad_norm"].get<double>(), reference.at(s)["grad_norm"].get<double>()) << name << " step " << s;
  }
}

TEST(Resume, SingleProcessIsBitIdentical) {
  tiny_config(dir());
  Launch ref = run(train_cmd(dir(), "ref1", ""));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical("single", 1, "", read_log(dir() / "ref1.jsonl"));
}

TEST(Resume, SingleProcessWithKfacIsBitIdentical) {
  tiny_config(dir());
  const std::string k = "--set kfac.enabled=true --set kfac.placement=inline --set kfac.inverse_every=2 --set kfac.ema=0.5";
  Launch ref = run(train_cmd(dir(), "refk", k));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical("kfac", 1, k, read_log(dir() / "refk.jsonl"));
}

// SOAP's state (the moments in the rotated basis, L, R and their bases Q_L, Q_R) is in the
// checkpoint: a refresh every 2 of SOAP's steps puts them at steps 3 and 5, so the run resumed
// from step 3 continues across a refresh, in one process and in a 2-stage pipeline.
TEST(Resume, SoapIsBitIdentical) {
  tiny_config(dir());
  const std::string soap = "--set optim.name=soap --set optim.soap.precondition_frequency=2";
  Launch ref = run(train_cmd(dir(), "refsoap", soap));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical("soap", 1, soap, read_log(dir() / "refsoap.jsonl"));
  const std::string pipe = soap + " --set parallel.stages=2";
  Launch ref2 = run(mpi_train_cmd(2, dir(), "refsoap2", pipe));
  ASSERT_EQ(ref2.status, 0) << ref2.out;
  expect_resume_identical("soap-pipe2", 2, pipe, read_log(dir() / "refsoap2.jsonl"));
}

// GPT-2's Conv1D weights are stored transposed ([in, out]): a GPT checkpoint resumes, and its
// weights load as --init into `pipefisher eval`, equal to the run's model.safetensors.
TEST(Resume, GptCheckpointResumesAndLoadsAsInit) {
  tiny_config(dir());
  const std::string gpt = std::string("--set model.arch=gpt --set data.vocab=gpt2 --set data.train_file=") +
                          PF_SOURCE_DIR + "/data/sample/moby-dick-1-20.gpt2.bin --set data.valid_file=" +
                          PF_SOURCE_DIR + "/data/sample/moby-dick-1-20.gpt2.bin";
  Launch ref = run(train_cmd(dir(), "refgpt", gpt));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical("gpt", 1, gpt, read_log(dir() / "refgpt.jsonl"));
  auto eval = [&](const fs::path& init) {
    Launch r = run(kEnv + kBinary + " eval --config " + (dir() / "tiny.toml").string() + " " + gpt + " --init " +
                   init.string() + " --json");
    EXPECT_EQ(r.status, 0) << r.out;
    return nlohmann::json::parse(r.out.substr(r.out.rfind('{'))).at("loss").get<double>();
  };
  // The resumed run's own checkpoint directory holds its last step: the final model.
  EXPECT_EQ(eval(dir() / "gpt-ckpt-resumed"), eval(dir() / "out-gpt-resumed" / "model.safetensors"));
}

TEST(Resume, TwoStagePipelineIsBitIdentical) {
  tiny_config(dir());
  Launch ref = run(mpi_train_cmd(2, dir(), "ref2", "--set parallel.stages=2"));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical("pipe2", 2, "--set parallel.stages=2", read_log(dir() / "ref2.jsonl"));
}

// Saved by a 4-stage pipeline, loaded by name: the weights of its last checkpoint are exactly the
// model the run saved (gathered), and one process resumes from its step-3 checkpoint with the
// pipeline's losses (to rounding: the summation order differs); --init reads a checkpoint directory.
TEST(Resume, FourStageCheckpointLoadsIntoOneProcess) {
  tiny_config(dir());
  const fs::path ck = dir() / "four-ckpt";
  Launch four = run(mpi_train_cmd(4, dir(), "four", "--set parallel.stages=4 --set train.checkpoint_every=3 "
                                                    "--set train.keep_checkpoints=5 --set train.checkpoint_dir=" + ck.string()));
  ASSERT_EQ(four.status, 0) << four.out;
  pf::CheckpointReader r((ck / "step-000006").string());
  int weight_files = 0;
  for (const auto& f : r.manifest().files) weight_files += f.name.rfind("weights-stage-", 0) == 0;
  EXPECT_EQ(weight_files, 4);

  pf::Config cfg = pf::Config::load((dir() / "tiny.toml").string());
  auto whole = pf::build_model(cfg.model, 0, pf::num_blocks(cfg.model) - 1);
  auto saved = pf::build_model(cfg.model, 0, pf::num_blocks(cfg.model) - 1);
  r.load_params(whole->params());
  pf::load_safetensors((dir() / "out-four" / "model.safetensors").string(), saved->params());
  for (pf::Param* p : whole->params())
    ASSERT_EQ(std::memcmp(p->value.data(), saved->find_param(p->name)->value.data(), p->value.numel() * sizeof(float)), 0)
        << p->name;

  // --init takes a checkpoint directory too: the same first step as from the gathered file.
  Launch from_dir = run(train_cmd(dir(), "init-dir", "--steps 1 --init " + ck.string()));
  Launch from_file = run(train_cmd(dir(), "init-file", "--steps 1 --init " + (dir() / "out-four" / "model.safetensors").string()));
  ASSERT_EQ(from_dir.status, 0) << from_dir.out;
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_EQ(read_log(dir() / "init-dir.jsonl").at(1)["loss"].get<double>(),
            read_log(dir() / "init-file.jsonl").at(1)["loss"].get<double>());

  fs::remove_all(ck / "step-000006");
  Launch one = run(train_cmd(dir(), "four-resumed", "--resume " + ck.string()));
  ASSERT_EQ(one.status, 0) << one.out;
  const auto ref = read_log(dir() / "four.jsonl"), log = read_log(dir() / "four-resumed.jsonl");
  ASSERT_EQ(log.size(), 3u);
  for (int64_t s = 4; s <= 6; ++s)
    EXPECT_NEAR(log.at(s)["loss"].get<double>(), ref.at(s)["loss"].get<double>(), 1e-5) << "step " << s;
}

TEST(Resume, RefusesWhatCannotContinue) {
  tiny_config(dir());
  const fs::path ck = dir() / "refuse-ckpt";
  Launch first = run(train_cmd(dir(), "refuse", "--set train.checkpoint_every=2 --set train.checkpoint_dir=" + ck.string()));
  ASSERT_EQ(first.status, 0) << first.out;
  fs::remove_all(ck / "step-000006");
  Launch seed = run(train_cmd(dir(), "refuse2", "--resume " + ck.string() + " --set train.seed=7"));
  EXPECT_EQ(seed.status, 2) << seed.out;
  EXPECT_TRUE(contains(seed.out, "train.seed: the checkpoint at step 4")) << seed.out;
  Launch done = run(train_cmd(dir(), "refuse3", "--resume " + ck.string() + " --steps 4"));
  EXPECT_EQ(done.status, 2) << done.out;
  EXPECT_TRUE(contains(done.out, "--resume: the checkpoint is at step 4")) << done.out;
  Launch none = run(train_cmd(dir(), "refuse4", "--resume " + (dir() / "empty").string()));
  EXPECT_EQ(none.status, 2) << none.out;
  EXPECT_TRUE(contains(none.out, "--resume: no checkpoint directory")) << none.out;
  Launch both = run(train_cmd(dir(), "refuse5", "--resume " + ck.string() + " --init " + (ck / "x").string()));
  EXPECT_EQ(both.status, 2) << both.out;
  EXPECT_TRUE(contains(both.out, "--init: no such file or checkpoint directory")) << both.out;
  Launch two = run(train_cmd(dir(), "refuse6", "--resume " + ck.string() + " --init " + ck.string()));
  EXPECT_EQ(two.status, 2) << two.out;
  EXPECT_TRUE(contains(two.out, "--init: give --init or --resume, not both")) << two.out;
  // The MPI runtime refuses alike (the same check, train/checkpointing.hpp).
  Launch mpi = run(mpi_train_cmd(2, dir(), "refuse7", "--set parallel.stages=2 --resume " + ck.string() + " --init " +
                                                        ck.string()));
  EXPECT_EQ(mpi.status, 2) << mpi.out;
  EXPECT_TRUE(contains(mpi.out, "--init: give --init or --resume, not both")) << mpi.out;
}

// --- the MPI runtime with K-FAC ---

// Runs 8 steps checkpointing every 3 (and after the last), drops the step-6 and step-8
// checkpoints and resumes from step 3 (mid-cycle: PipeFisher plans a refresh every 2+ steps here). Compared with the run that wrote the
// checkpoint, not with another one: PipeFisher plans from the timings its run measured, so
// another run may plan another refresh pattern; the resumed run must remake the same plan.
// kfac.replan_on_drift = false: a re-plan on drift follows the timings of each run.
// first_out: the first run's output, when given.
void expect_kfac_resume_identical(const std::string& name, int np, const std::string& sets, const std::string& seams = "",
                                  int64_t steps = 8, int64_t from = 3, std::string* first_out = nullptr) {
  const fs::path ck = dir() / (name + "-ckpt");
  const std::string s = "--set kfac.enabled=true --set kfac.damping=3e-2 --set kfac.replan_on_drift=false "
                        "--set train.steps=" + std::to_string(steps) + " --set train.checkpoint_every=" +
                        std::to_string(from) + " --set train.keep_checkpoints=3 "
                        "--set train.checkpoint_dir=" + ck.string() + " " + sets + " " + seams;
  Launch first = run(mpi_train_cmd(np, dir(), name, s));
  if (first_out) *first_out = first.out;
  ASSERT_EQ(first.status, 0) << first.out;
  const fs::path at = ck / fmt::format("step-{:06d}", from);
  ASSERT_TRUE(fs::exists(at / ("kfac-rank-" + std::to_string(np - 1) + ".safetensors")));
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path() != at) fs::remove_all(e.path());
  // Another run directory: its own checkpoint directory (ck belongs to the first run's).
  Launch resumed = run(mpi_train_cmd(np, dir(), name + "-resumed",
                                     s + " --resume " + ck.string() + " --set train.checkpoint_dir=" + ck.string() + "-resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, fmt::format("(step {})", from))) << resumed.out;
  const auto ref = read_log(dir() / (name + ".jsonl")), log = read_log(dir() / (name + "-resumed.jsonl"));
  ASSERT_EQ(static_cast<int64_t>(log.size()), steps - from);
  for (int64_t st = from + 1; st <= steps; ++st) {
    EXPECT_EQ(log.at(st)["loss"].get<double>(), ref.at(st)["loss"].get<double>()) << name << " step " << st;
    EXPECT_EQ(log.at(st)["grad_norm"].get<double>(), ref.at(st)["grad_norm"].get<double>()) << name << " step " << st;
  }
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const fs::path a = dir() / ("out-" + name), b = dir() / ("out-" + name + "-resumed");
  EXPECT_EQ(bytes(a / "model.safetensors"), bytes(b / "model.safetensors")) << name << ": final weights differ";
  // The refresh record (which inverse each factor used from which step) continues too.
  EXPECT_EQ(bytes(a / "kfac_refresh.json"), bytes(b / "kfac_refresh.json")) << name;
}

TEST(Resume, PipelineKfacIsBitIdentical) {
  tiny_config(dir());
  expect_kfac_resume_identical("kfac-bubbles", 2, "--set parallel.stages=2 --set kfac.placement=bubbles");
  // The adaptive filler's running profile is not saved: it decides when units run, not what they compute.
  expect_kfac_resume_identical("kfac-adaptive", 2, "--set parallel.stages=2 --set kfac.placement=adaptive");
  // Its refresh cycles re-planned from the steps as run (at 1/10000 of their cost: one-step
  // cycles) at step 8, 10 or 12, around the checkpoint at 9: the plan in use, the steady state's
  // sums and a switch still to come are restored.
  expect_kfac_resume_identical("kfac-adapting", 2, "--set parallel.stages=2 --set kfac.placement=adaptive",
                               "--test-kfac-cost-scale 3,0.0001 ", 14, 9);
  // Chimera's twins sum their curvature at SYNC_CURV (replicated chunks, pending inverses); its
  // tiny bubbles need the planner to see scaled-down costs to refresh within the run.
  expect_kfac_resume_identical("kfac-chimera", 2, "--set parallel.stages=2 --set parallel.schedule=chimera "
                               "--set kfac.placement=bubbles", "--test-kfac-cost-scale 0.0001 ");
  // Chimera on 4 devices: the twins share each stage's inversions (broadcast from their owner),
  // each pair with its own cycle, and a cycle's inversions overlap the next one's curvature (the
  // factors' own accumulators hold sums in progress at the checkpoint).
  expect_kfac_resume_identical("kfac-chimera-4", 4, "--set parallel.stages=4 --set parallel.schedule=chimera "
                               "--set kfac.placement=bubbles", "--test-kfac-cost-scale 0.05 --test-bcast-model 0,0 ");
  // 2 replicas per stage: a stage's inversion pieces placed by Algorithm 1 (a fixed broadcast
  // model, so that some are broadcast from their owner and some inverted by every replica).
  expect_kfac_resume_identical("kfac-bubbles-w2", 4, "--set parallel.stages=2 --set parallel.data_parallel=2 "
                               "--set parallel.micro_batches=2 --set kfac.placement=bubbles",
                               "--test-bcast-model 0.03,0 ");
  // Replicas, and Chimera's twins with replicas, splitting each stage's precondition by layer (a
  // free broadcast: every layer preconditioned by one holder, the results all-gathered).
  expect_kfac_resume_identical("kfac-bubbles-w2-split", 4, "--set parallel.stages=2 --set parallel.data_parallel=2 "
                               "--set parallel.micro_batches=2 --set kfac.placement=bubbles", "--test-bcast-model 0,0 ");
  expect_kfac_resume_identical("kfac-chimera-w2", 4, "--set parallel.stages=2 --set parallel.schedule=chimera "
                               "--set parallel.data_parallel=2 --set kfac.placement=bubbles",
                               "--test-kfac-cost-scale 0.0001 --test-bcast-model 0,0 ");
  expect_kfac_resume_identical("kfac-skip-w2", 4, "--set parallel.stages=2 --set parallel.data_parallel=2 "
                               "--set parallel.micro_batches=2 --set kfac.placement=skip --set kfac.inverse_every=2 "
                               "--set kfac.ema=0.5");
}

// A checkpoint written while PipeFisher drains (drift decided: each device finishes its cycle, then
// all re-profile) resumes bit for bit: the drain's boundary, its re-profile step and the lists it
// runs come back from the phase's record. --test-drift-at 3 counts steps 3-5, the plan's first
// three, as 10x their time, so drift is decided at step 5 whatever the machine's load, and the
// checkpoint is written there; a re-profile from step 7 or later means it was written in the
// drain. The run ends at step 7, before the re-profile's plan (made from each run's own timings).
TEST(Resume, PipelineKfacResumesInTheMiddleOfADrain) {
  tiny_config(dir());
  std::string out;
  expect_kfac_resume_identical("kfac-draining", 2, "--set parallel.stages=2 --set kfac.placement=bubbles "
                               "--set kfac.replan_on_drift=true", "--test-drift-at 3 ", 7, 5, &out);
  const std::string drift = "pipefisher: step ", replan = "re-profiling from step ";
  const size_t at = out.find(drift);
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_EQ(std::stoll(out.substr(at + drift.size())), 5) << out;
  const size_t re = out.find(replan, at);
  ASSERT_NE(re, std::string::npos) << out;
  EXPECT_GE(std::stoll(out.substr(re + replan.size())), 7) << out;
}

// A zero-bubble schedule's W runs after its I, apart: nothing of a step is left for the next
// (every W of a step runs before its OPT), so a resumed run continues bit for bit, with K-FAC in
// the bubbles too.
void expect_zero_bubble_resume_identical(const std::string& schedule) {
  tiny_config(dir());
  const std::string zb = "--set parallel.stages=2 --set parallel.schedule=" + schedule;
  std::string tag = schedule;
  std::erase(tag, '-');
  Launch ref = run(mpi_train_cmd(2, dir(), "ref" + tag, zb));
  ASSERT_EQ(ref.status, 0) << ref.out;
  expect_resume_identical(tag, 2, zb, read_log(dir() / ("ref" + tag + ".jsonl")));
  expect_kfac_resume_identical("kfac-" + tag, 2, zb + " --set kfac.placement=bubbles");
}

TEST(Resume, ZeroBubbleH1IsBitIdentical) { expect_zero_bubble_resume_identical("zb-h1"); }
// ZB-V: two chunks per rank, rank 0 holding the first and the last stage.
TEST(Resume, ZeroBubbleVIsBitIdentical) { expect_zero_bubble_resume_identical("zb-v"); }
TEST(Resume, ZeroBubbleH2AndAutoAreBitIdentical) {
  expect_zero_bubble_resume_identical("zb-h2");
  expect_zero_bubble_resume_identical("zb-auto");
}

// Data-parallel K-FAC is the executor with one stage: its checkpoints carry each replica's
// DistributedKfac state too (the fusion plan made from the first two curvature steps' timings),
// so the resumed run goes on posting the fused, pipelined messages instead of profiling again
// (with 3 or more replicas the message sizes may decide MPI's summation order).
TEST(Resume, DataParallelKfacIsBitIdentical) {
  tiny_config(dir());
  expect_kfac_resume_identical("kfac-dp2-spd", 2, "--set parallel.data_parallel=2 --set kfac.placement=inline");
  expect_kfac_resume_identical("kfac-dp4-skip", 4, "--set parallel.data_parallel=4 --set parallel.micro_batches=1 "
                               "--set kfac.placement=skip --set kfac.inverse_every=2 --set kfac.ema=0.5");
  // Curvature steps 0 and 2 profile; 4 and 6 (after the checkpoint at 3) post the planned
  // messages in both runs: a resumed run that profiled again would count none.
  auto read_json = [](const fs::path& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
  };
  for (const std::string name : {"kfac-dp2-spd", "kfac-dp4-skip"}) {
    const auto a = read_json(dir() / ("out-" + name) / "dkfac.json"),
               b = read_json(dir() / ("out-" + name + "-resumed") / "dkfac.json");
    EXPECT_GT(a["factor_messages"].get<double>(), 0) << name;
    EXPECT_EQ(a["factor_messages"], b["factor_messages"]) << name;
    EXPECT_EQ(a["fused_messages"], b["fused_messages"]) << name;
  }
}

// Each rank's K-FAC state belongs to its place in the layout: another layout is refused (exit 2,
// naming --resume), one process included; the weights still start another layout through --init.
TEST(Resume, PipelineKfacRefusesAnotherLayout) {
  tiny_config(dir());
  const fs::path ck = dir() / "kfac-layout-ckpt";
  const std::string k = "--set kfac.enabled=true --set kfac.placement=inline --set train.steps=4 "
                        "--set train.checkpoint_every=2 --set train.checkpoint_dir=" + ck.string();
  Launch first = run(mpi_train_cmd(2, dir(), "kfac-layout", "--set parallel.stages=2 " + k));
  ASSERT_EQ(first.status, 0) << first.out;
  fs::remove_all(ck / "step-000004");
  Launch other = run(mpi_train_cmd(2, dir(), "kfac-layout2", "--set parallel.stages=2 --set parallel.schedule=gpipe " + k +
                                                             " --resume " + ck.string()));
  EXPECT_EQ(other.status, 2) << other.out;
  EXPECT_TRUE(contains(other.out, "--resume: the checkpoint's K-FAC state was written by 2 stages (1f1b)")) << other.out;
  Launch one = run(train_cmd(dir(), "kfac-layout1", "--set parallel.stages=1 " + k + " --resume " + ck.string()));
  EXPECT_EQ(one.status, 2) << one.out;
  EXPECT_TRUE(contains(one.out, "--resume: the checkpoint's K-FAC state was written by 2 stages (1f1b) x 1 "
                                "data-parallel, this run is 1 process")) << one.out;
  EXPECT_FALSE(fs::exists(dir() / "out-kfac-layout1"));
  Launch init = run(mpi_train_cmd(2, dir(), "kfac-layout3", "--set parallel.stages=2 --set parallel.schedule=gpipe "
                                                            "--set kfac.enabled=true --set train.steps=1 --init " + ck.string()));
  EXPECT_EQ(init.status, 0) << init.out;
}

}  // namespace
