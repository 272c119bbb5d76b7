// Weights that do not fit the configured model are refused before anything is written, naming
// the file and the first tensor (or configuration key) at fault: NaN or Inf in --init weights (for
// train, eval and generate), and a checkpoint of another model given to --resume or --init (a
// tensor the model lacks, one it has in another shape). A complete step directory is an --init.
#include "cli.hpp"

#include "io/safetensors.hpp"

#include <cstring>
#include <fstream>
#include <limits>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("weights_fit"); }

// Overwrites element `index` of tensor `name` in the safetensors file `path` with `value`.
void poke(const fs::path& path, const std::string& name, size_t index, float value) {
  uint64_t header = 0, begin = 0;
  {
    const pf::SafetensorsReader r(path.string());
    const pf::SafetensorsEntry* e = r.find(name);
    ASSERT_NE(e, nullptr) << name;
    ASSERT_EQ(e->dtype, "F32");
    begin = e->begin;
    std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  }
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(8 + header + begin + 4 * index));
  f.write(reinterpret_cast<const char*>(&value), 4);
}

std::string sample(const std::string& vocab) {
  return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20." + vocab + ".bin";
}

// A tiny GPT's --set flags (generate needs a causal LM).
std::string gpt_sets() {
  return " --set model.arch=gpt --set data.vocab=gpt2 --set data.train_file=" + sample("gpt2") +
         " --set data.valid_file=" + sample("gpt2") + " --set model.max_position=16";
}

// NaN or Inf in --init's weights: status 2, one line naming the file, the tensor and the element,
// never a loss of nan (eval said "nan (masked LM nan + NSP)" with NSP off) or a run skipping
// every step; train refuses before making its out_dir.
TEST(WeightsFit, NonFiniteInitIsRefusedByTrainEvalAndGenerate) {
  const fs::path cfg = tiny_config(dir());
  Launch bert = run(train_cmd(dir(), "nf-bert", "--steps 1"));
  ASSERT_EQ(bert.status, 0) << bert.out;
  const fs::path w = dir() / "out-nf-bert" / "model.safetensors";
  const std::string tensor = "bert.encoder.layer.1.attention.self.query.weight";
  poke(w, tensor, 3, std::numeric_limits<float>::quiet_NaN());
  const std::string want = "pipefisher: " + w.string() + ": tensor '" + tensor +
                           "' holds a non-finite value (nan at index 3): weights and training state must be finite\n";
  Launch eval = run(kEnv + kBinary + " eval --config " + cfg.string() + " --init " + w.string());
  EXPECT_EQ(eval.status, 2) << eval.out;
  EXPECT_EQ(eval.out, want);
  Launch train = run(train_cmd(dir(), "nf-train", "--init " + w.string()));
  EXPECT_EQ(train.status, 2) << train.out;
  EXPECT_EQ(train.out, want);
  EXPECT_FALSE(fs::exists(dir() / "out-nf-train"));

  Launch gpt = run(train_cmd(dir(), "nf-gpt", "--steps 1" + gpt_sets()));
  ASSERT_EQ(gpt.status, 0) << gpt.out;
  const fs::path g = dir() / "out-nf-gpt" / "model.safetensors";
  poke(g, "transformer.h.0.mlp.c_fc.weight", 0, -std::numeric_limits<float>::infinity());
  Launch gen = run(kEnv + kBinary + " generate --config " + cfg.string() + gpt_sets() + " --init " + g.string() +
                   " --vocab-dir " PF_SOURCE_DIR "/data/vocab --max-new-tokens 2");
  EXPECT_EQ(gen.status, 2) << gen.out;
  EXPECT_EQ(gen.out, "pipefisher: " + g.string() + ": tensor 'transformer.h.0.mlp.c_fc.weight' holds a non-finite "
                     "value (-inf at index 0): weights and training state must be finite\n");
}

// A checkpoint of a 4-layer model resumed (or loaded) as a 3-layer one: refused naming the key the
// manifest recorded, or for a checkpoint without it the first tensor the model lacks or has in
// another shape; nothing is written. The model it was written for loads it, from the step
// directory itself too.
TEST(WeightsFit, CheckpointOfAnotherModelIsRefused) {
  const fs::path cfg = tiny_config(dir());
  const fs::path ck = dir() / "four-layers";
  Launch first = run(train_cmd(dir(), "four", "--steps 2 --set train.checkpoint_every=2 --set train.checkpoint_dir=" +
                                                  ck.string()));
  ASSERT_EQ(first.status, 0) << first.out;
  const std::string more = " --set train.steps=4 --set optim.decay_steps=4 --resume " + ck.string();
  Launch layers = run(train_cmd(dir(), "three", "--set model.layers=3" + more));
  EXPECT_EQ(layers.status, 2) << layers.out;
  EXPECT_EQ(layers.out, "pipefisher: model.layers: the checkpoint at step 2 was written with model.layers = 4, this "
                        "configuration has 3\n");
  EXPECT_FALSE(fs::exists(dir() / "out-three"));

  // A manifest from before the model's keys were recorded: the tensors decide.
  const fs::path manifest = ck / "step-000002" / "manifest.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
  for (const char* k : {"model.arch", "model.layers", "model.hidden", "model.heads", "model.ffn", "model.vocab",
                        "model.max_position"})
    m["info"].erase(k);
  std::ofstream(manifest) << m.dump(2);
  const std::string extra = "pipefisher: " + (ck / "step-000002" / "weights-stage-0.safetensors").string() +
                            ": tensor 'bert.encoder.layer.3.attention.self.query.weight' is not a parameter of the "
                            "configured model (bert, model.layers = 3, model.hidden = 32): the checkpoint is of "
                            "another model\n";
  Launch old = run(train_cmd(dir(), "three-old", "--set model.layers=3" + more));
  EXPECT_EQ(old.status, 2) << old.out;
  EXPECT_EQ(old.out, extra);
  EXPECT_FALSE(fs::exists(dir() / "out-three-old"));
  // The MPI runtime refuses alike, every rank before anything is written (the same check).
  Launch mpi = run(mpi_train_cmd(2, dir(), "three-mpi", "--set parallel.stages=2 --set model.layers=3" + more));
  EXPECT_EQ(mpi.status, 2) << mpi.out;
  EXPECT_TRUE(contains(mpi.out, extra)) << mpi.out;
  EXPECT_FALSE(fs::exists(dir() / "out-three-mpi"));
  Launch wider = run(train_cmd(dir(), "wider", "--set model.ffn=96" + more));
  EXPECT_EQ(wider.status, 2) << wider.out;
  EXPECT_TRUE(contains(wider.out, "tensor 'bert.encoder.layer.0.intermediate.dense.weight': shape [64,32] in the "
                                  "file, the model expects [96,32]")) << wider.out;
  Launch init = run(train_cmd(dir(), "three-init", "--set model.layers=3 --init " + ck.string()));
  EXPECT_EQ(init.status, 2) << init.out;
  EXPECT_EQ(init.out, extra);
  Launch eval3 = run(kEnv + kBinary + " eval --config " + cfg.string() + " --set model.layers=3 --init " +
                     (ck / "step-000002").string());
  EXPECT_EQ(eval3.status, 2) << eval3.out;
  EXPECT_EQ(eval3.out, extra);

  Launch eval = run(kEnv + kBinary + " eval --config " + cfg.string() + " --json --init " + (ck / "step-000002").string());
  ASSERT_EQ(eval.status, 0) << eval.out;
  EXPECT_TRUE(contains(eval.out, "\"loss\":")) << eval.out;
  Launch resumed = run(train_cmd(dir(), "four-more", more));
  EXPECT_EQ(resumed.status, 0) << resumed.out;
}

}  // namespace
