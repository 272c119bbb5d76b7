// Bad input: every loader refuses malformed, truncated or oversized input with a UsageError (a
// one-line message naming the file or key), never another exception. The first tests are the
// regressions of what the fuzzers (fuzz/, scripts/fuzz.sh) found.
#include "config/config.hpp"
#include "config/limits.hpp"
#include "core/error.hpp"
#include "data/bpe.hpp"
#include "data/token_file.hpp"
#include "data/wordpiece.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "kfac/refresh_record.hpp"
#include "schedule/schedule.hpp"
#include "sim/limits.hpp"
#include "sim/profile.hpp"
#include "sim/sim.hpp"
#include "schedule/generators.hpp"
#include "train/checkpointing.hpp"
#include "viz/render.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <functional>
#include <string>

namespace {
// The default job as one process runs it (parallel.data_parallel = auto resolved to 1).
pf::Config one_process() {
  pf::Config c;
  pf::resolve_data_parallel(c, 1);
  return c;
}

namespace fs = std::filesystem;

fs::path file(const std::string& name, const std::string& bytes) {
  const fs::path d = pf_test::scratch_dir("bad_input");
  std::ofstream(d / name, std::ios::binary) << bytes;
  return d / name;
}

// Throws a UsageError whose message contains `what` (and nothing else escapes).
void expect_refused(const std::function<void()>& fn, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected a refusal mentioning '" << what << "'";
  } catch (const pf::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
  }
}

// fuzz_schedule: numbers beyond int made std::stoi throw std::out_of_range (the CLI exited 1
// with "stoi" instead of naming the file), in the header, a device cell and an action token.
TEST(FuzzRegressions, ScheduleNumbersTooLarge) {
  expect_refused([] { pf::parse_csv("# pipefisher schedule name=gpipe devices=1 stages=2999999999999999999 pipelines=1 "
                                    "micro_batches=2\nde\x01", "s.csv"); },
                 "s.csv:1: header number 2999999999999999999 is too large");
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=1 stages=1 pipelines=1 micro_batches=1\n"
                                     "99999999999: 0F0\n", "s.txt"); },
                 "s.txt");
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=1 stages=1 pipelines=1 micro_batches=1\n"
                                     "0: 0F99999999999\n", "s.txt"); },
                 "number 99999999999 is too large");
  // Within int but absurd: refused before allocating per-device tables.
  expect_refused([] { pf::parse_text("# pipefisher schedule name=a devices=2000000000 stages=1 pipelines=1 micro_batches=1\n",
                                     "s.txt"); },
                 "too large");
}

// fuzz_config_overrides: a --set value with bytes that are not UTF-8 (taken as a bare string)
// was accepted, and the config.toml printed from it did not load back; a TOML "\u0000" would
// cut a path short.
TEST(FuzzRegressions, ConfigTextMustBeUtf8WithoutNul) {
  expect_refused([] { pf::Config::from_toml_string("# ", {std::string("data.train_file =l\xff\xff\xff") + "1"}); },
                 "data.train_file: must be UTF-8 text without NUL characters");
  expect_refused([] { pf::Config::from_toml_string("[train]\nout_dir = \"runs/a\\u0000b\"\n"); },
                 "train.out_dir: must be UTF-8 text without NUL characters");
  expect_refused([] { pf::Config::from_toml_string("", {std::string("train.log_json=\xc0\xaf")}); },  // overlong '/'
                 "train.log_json: must be UTF-8");
  const pf::Config c = pf::Config::from_toml_string("", {"train.out_dir=runs/é-\u00e9-日本"});
  EXPECT_EQ(pf::Config::from_toml_string(c.to_toml()).to_toml(), c.to_toml());
}

TEST(BadInput, SafetensorsTruncatedOrLying) {
  std::string header = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  const std::string good = len + header + std::string(8, '\0');
  EXPECT_NO_THROW(pf::SafetensorsReader(file("good.safetensors", good).string()));
  expect_refused([&] { pf::SafetensorsReader(file("t.safetensors", good.substr(0, good.size() - 1)).string()); }, "t.safetensors");
  expect_refused([&] { pf::SafetensorsReader(file("h.safetensors", good.substr(0, 20)).string()); }, "h.safetensors");
  expect_refused([&] { pf::SafetensorsReader(file("e.safetensors", "").string()); }, "e.safetensors");
  std::string huge(8, '\xff');  // header length 2^64 - 1
  expect_refused([&] { pf::SafetensorsReader(file("l.safetensors", huge + "{}").string()); }, "l.safetensors");
}

TEST(BadInput, TokenFiles) {
  expect_refused([] { pf::read_token_file(file("odd.bin", "abc").string(), 30522); }, "odd.bin");
  expect_refused([] { pf::read_token_file(file("big.bin", "\xff\xff").string(), 30522); }, "big.bin");
  expect_refused([] { pf::read_token_file((fs::temp_directory_path() / "pf-absent.bin").string(), 30522); }, "pf-absent.bin");
}

TEST(BadInput, ConfigurationText) {
  expect_refused([] { pf::Config::from_toml_string("[model\nlayers = 2"); }, "");
  expect_refused([] { pf::Config::from_toml_string("[model]\nlayers = \"two\"\n"); }, "model.layers");
  expect_refused([] { pf::Config::from_toml_string("[model]\nlayers = 99999999999999999999\n"); }, "");
  expect_refused([] { pf::Config::from_toml_string("[train]\nkeep_checkpoints = -1\n").validate(); }, "train.keep_checkpoints");
}

TEST(BadInput, ProfilesAndTokenizerFiles) {
  expect_refused([] { pf::read_profile_json(file("p.json", R"({"format": "pipefisher-profile", "vers)").string()); }, "--profile");
  expect_refused([] { pf::read_paper_csv(file("p.csv", "bs,time_f\n8,1\n").string()); }, "--profile");
  expect_refused([] { pf::WordPieceTokenizer::load(file("vocab.txt", "").string()); }, "vocab.txt");
  expect_refused([] { pf::Gpt2Tokenizer::load(file("enc.json", "{\"a\": ").string(), file("v.bpe", "#version: 0.2\n").string()); },
                 "enc.json");
}

// --- issue 12: every defect found by probing ---

// Item 2: inf and nan are TOML numbers; 1e39 is a double but not a float. Each is refused naming
// the key, from a file and from an override alike.
TEST(Hardening, NonFiniteConfigValuesAreRefused) {
  for (const char* key : {"optim.lr", "optim.weight_decay", "optim.eps", "optim.grad_clip", "kfac.damping",
                          "model.init_std", "model.dropout", "data.mask_prob"})
    for (const char* v : {"inf", "-inf", "nan"}) {
      const std::string kv = std::string(key) + "=" + v;
      expect_refused([&] { pf::Config::from_toml_string("", {kv}); }, std::string(key) + ": must be a finite number");
    }
  expect_refused([] { pf::Config::from_toml_string("[optim]\nlr = inf\n"); }, "optim.lr: must be a finite number");
  expect_refused([] { pf::Config::from_toml_string("[model]\ninit_std = 1e39\n"); },
                 "model.init_std: must be a finite number within single precision");
  // A Config built in code is checked too.
  pf::Config c;
  c.optim.lr = std::numeric_limits<double>::infinity();
  expect_refused([&] { c.validate(); }, "optim.lr: must be a finite number");
}

// Item 9: kfac.warmup_steps = -1 means optim.warmup_steps; below is a mistake.
TEST(Hardening, OutOfRangeIntegersAreRefused) {
  expect_refused([] { pf::Config::from_toml_string("", {"kfac.warmup_steps=-5"}); }, "kfac.warmup_steps");
  EXPECT_NO_THROW(pf::Config::from_toml_string("", {"kfac.warmup_steps=-1"}));
  expect_refused([] { pf::Config::from_toml_string("", {"parallel.partition=[4, 99999999999]"}); },
                 "parallel.partition: 99999999999 is out of range");
  expect_refused([] { pf::Config::from_toml_string("", {"optim.decay_steps=-1"}); }, "optim.decay_steps");
}

// Item 9: a directory given as the configuration trained with the defaults.
TEST(Hardening, ConfigDirectoryIsRefused) {
  expect_refused([] { pf::Config::load(fs::temp_directory_path().string()); }, "--config: '");
}

// Items 3 and 9: sizes and threads are checked against what the machine has, naming the key.
TEST(Hardening, SizesAndThreadsBeyondTheMachineAreRefused) {
  const pf::MachineMemory mem = pf::machine_memory();
  ASSERT_GT(mem.bytes, 0);
  const struct {
    std::string kv, key;
  } cases[] = {
      {"model.hidden=2147483646", "model.hidden: 2147483646 makes the run need an estimated"},
      {"model.vocab=2000000000", "model.vocab: 2000000000 makes the run need an estimated"},
      {"parallel.micro_batch_size=2000000000", "parallel.micro_batch_size: 2000000000 makes the run need an estimated"},
      {"model.layers=100000000", "model.layers: 100000000 makes the run need an estimated"},
  };
  for (const auto& c : cases) {
    pf::Config cfg;
    try {
      cfg = pf::Config::from_toml_string("", {c.kv, "model.heads=2"});
      pf::resolve_data_parallel(cfg, 1);
    } catch (const pf::UsageError& e) {
      ADD_FAILURE() << c.kv << ": refused by validate, not by the resource check: " << e.what();
      continue;
    }
    expect_refused([&] { pf::check_resources(cfg); }, c.key);
    expect_refused([&] { pf::check_resources(cfg); }, "; this machine has ");
    expect_refused([&] { pf::check_resources(cfg); }, " available (");
  }
  // 65536 segfaulted in libgomp, 32768 exited 1: their stacks alone exceed this machine (or the
  // kernel's thread limits do).
  for (int n : {65536, 32768}) {
    pf::Config cfg = pf::Config::from_toml_string("", {"train.threads=" + std::to_string(n)});
    pf::resolve_data_parallel(cfg, 1);
    expect_refused([&] { pf::check_resources(cfg); }, "train.threads: " + std::to_string(n) + " threads");
  }
  // The default job fits, well under this machine's memory.
  EXPECT_NO_THROW(pf::check_resources(one_process()));
  EXPECT_LT(pf::estimate_peak_bytes(one_process()), 2e9);
}

// Item 8: the check compares with the memory available now, never more than the machine has.
TEST(Hardening, MemoryCheckUsesWhatIsAvailable) {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kb = 0, total = -1;
  while (f >> key >> kb >> unit)
    if (key == "MemTotal:") total = kb * 1024;
  ASSERT_GT(total, 0);
  const pf::MachineMemory mem = pf::machine_memory();
  EXPECT_GE(mem.bytes, 0);
  EXPECT_LE(mem.bytes, total);
  EXPECT_TRUE(mem.source.find("MemAvailable") != std::string::npos || mem.source.find("cgroup") != std::string::npos)
      << mem.source;
}

// Item 8: the peak estimate holds every micro-batch's activations under the MPI runtime (a state
// each), one at a time in one process.
TEST(Hardening, MemoryEstimateCountsMicroBatchesInFlight) {
  auto peak = [](const std::string& schedule, int stages, int mbs) {
    pf::Config c = pf::Config::from_toml_string(
        "", {"parallel.schedule=" + schedule, "parallel.stages=" + std::to_string(stages),
             "parallel.micro_batches=" + std::to_string(mbs), "model.seq_len=128", "parallel.micro_batch_size=8"});
    pf::resolve_data_parallel(c, stages);
    return pf::estimate_peak_bytes(c, stages, stages);
  };
  EXPECT_GT(peak("gpipe", 2, 8), peak("gpipe", 2, 4));
  EXPECT_EQ(peak("1f1b", 2, 8), peak("gpipe", 2, 8));
  EXPECT_EQ(peak("gpipe", 1, 8), peak("gpipe", 1, 1));  // one process: one at a time
  EXPECT_GT(pf::estimate_peak_bytes(one_process()), pf::estimate_run_bytes(one_process()));
}

// Item 7: 1e999 made nlohmann throw out_of_range (exit 1, an abort under the fuzzer); 1.7e308
// and a huge count were accepted and overflowed later.
TEST(Hardening, ProfileNumbersBeyondRangeNameTheField) {
  const std::string head = R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4, "stages": [)";
  expect_refused([&] { pf::read_profile_json(file("o.json", head + R"({"forward": 1e999, "backward": 1}]})").string()); },
                 "'forward': the number 1e999 is beyond the range of a double");
  expect_refused([&] { pf::read_profile_json(file("h.json", head + R"({"forward": 1.7e308, "backward": 1}]})").string()); },
                 "'stages[0].forward' must be a finite number in [0, 9.007e+12]");
  expect_refused([&] { pf::read_profile_json(file("l.json", head + R"({"forward": 1, "backward": 1, "layers": 1e10}]})").string()); },
                 "'stages[0].layers' must be an integer");
  expect_refused([] { pf::read_paper_csv(file("i.csv", "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,"
                                                       "mem_peak_err,mem_save_err,mem_kron\n8,inf,1,1,1,1,1,1,1,1,1\n").string()); },
                 "expected a finite non-negative number");
  // Scaled past the bound (--layers-per-stage): refused before simulating.
  pf::ProfileRow row;
  row.bs = 8;
  row.time_f = 1e10;
  expect_refused([&] { pf::check_profile(pf::profile_from_row(row, 100000), "--profile"); }, "--profile: stage 0 forward");
}

// Item 1: bounds of the simulator, and an SVG of an empty or huge step ends.
TEST(Hardening, SimulatorBoundsAndRendering) {
  expect_refused([] { pf::check_schedule_size(100000, 400000, false, "--stages"); }, "--stages: 100000 devices");
  expect_refused([] { pf::check_schedule_size(64, 38400000, false, "--micro-batches"); },
                 "--micro-batches: about 38400000 actions");
  expect_refused([] { pf::check_schedule_size(8, pf::kMaxPlannedActions + 1, true, "--micro-batches"); },
                 "the PipeFisher planner takes");
  expect_refused([] { pf::check_schedule_size(2, 2 * pf::kMaxPlannedPerDevice + 2, true, "--micro-batches"); },
                 "actions per device and step");
  EXPECT_NO_THROW(pf::check_schedule_size(8, pf::kMaxPlannedActions, true, "--micro-batches"));
  expect_refused([] { pf::check_step_time(std::numeric_limits<double>::infinity(), "--tf"); }, "--tf: the step takes inf");
  pf::CostModel zero;
  zero.stages[0].forward = 0;
  zero.stages[0].backward = 0;
  const pf::Timeline tl = pf::simulate(pf::make_schedule("1f1b", 2, 4), zero);
  EXPECT_EQ(tl.step_time, 0);
  const std::string svg = pf::timeline_svg(tl, {});  // looped forever (tick 0)
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  pf::CostModel huge;
  huge.stages[0].forward = pf::kMaxDuration / 16;
  const std::string big = pf::timeline_svg(pf::simulate(pf::make_schedule("1f1b", 2, 4), huge), {});
  EXPECT_EQ(big.find("inf<"), std::string::npos);
  EXPECT_EQ(big.find("nan"), std::string::npos);
}

// No training output holds NaN or Inf: a diverged run's tensors are refused before the file is made.
TEST(Hardening, NonFiniteTensorsAreNotWritten) {
  pf::Param w("w", {2});
  w.value.span()[1] = std::numeric_limits<float>::infinity();
  const fs::path p = pf_test::scratch_dir("bad_input") / "nf.safetensors";
  expect_refused([&] { pf::save_trained_weights(p.string(), {&w}); }, "tensor 'w' holds a non-finite value (inf at index 1)");
  EXPECT_FALSE(fs::exists(p));
  w.value.span()[1] = std::numeric_limits<float>::quiet_NaN();
  expect_refused([&] { pf::save_trained_weights(p.string(), {&w}); }, "tensor 'w' holds a non-finite value (nan");
  EXPECT_FALSE(fs::exists(p));
  // The file format itself still carries special values (io/safetensors.hpp's round trip).
  EXPECT_NO_THROW(pf::save_safetensors(p.string(), {&w}));
}

// Item 8: a manifest whose step disagrees with its directory is refused; --resume says which newer
// checkpoints it passed over; the learning-rate schedule of the checkpoint's run is kept.
TEST(Hardening, ResumeChecksAndSaysWhatItPassedOver) {
  const fs::path ck = pf_test::scratch_dir("bad_input") / "ck";
  auto make = [&](int64_t step, int64_t says) {
    const std::string dir = pf::checkpoint_step_dir(ck.string(), step);
    fs::create_directories(dir);
    const std::vector<float> w = {1, 2};
    pf::CheckpointManifest m{says, {{"train.steps", "10"}}, {pf::write_checkpoint_tensors(dir, "w.safetensors", {{"w", {2}, w, false}})}};
    // commit_checkpoint names the directory by m.step: write the manifest of step `says` into `step`'s directory.
    pf::commit_checkpoint(ck.string(), {step, m.info, m.files}, 10);
    if (says != step) {
      std::ifstream in(fs::path(dir) / "manifest.json");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::string from = "\"step\": " + std::to_string(step), to = "\"step\": " + std::to_string(says);
      text.replace(text.find(from), from.size(), to);
      std::ofstream(fs::path(dir) / "manifest.json") << text;
    }
  };
  make(2, 2);
  make(4, 5);  // edited: says step 5 in step-000004
  expect_refused([&] { pf::read_checkpoint(pf::checkpoint_step_dir(ck.string(), 4)); },
                 "says step 5 but its directory is step 4");
  std::string passed;
  EXPECT_EQ(pf::find_latest_checkpoint(ck.string(), "--resume", &passed), pf::checkpoint_step_dir(ck.string(), 2));
  EXPECT_NE(passed.find("1 newer checkpoint not usable"), std::string::npos) << passed;
  EXPECT_NE(passed.find("says step 5 but its directory is step 4"), std::string::npos) << passed;

  pf::CheckpointManifest m{2, {{"train.steps", "10"}, {"lr_decay_steps", "10"}}, {}};
  pf::Config same = pf::Config::from_toml_string("", {"train.steps=10"});
  EXPECT_EQ(pf::keep_lr_schedule(same, m), "");
  pf::Config shorter = pf::Config::from_toml_string("", {"train.steps=6"});
  EXPECT_NE(pf::keep_lr_schedule(shorter, m).find("keeps the checkpoint's schedule"), std::string::npos);
  EXPECT_EQ(shorter.optim.decay_steps, 10);
  pf::Config longer = pf::Config::from_toml_string("", {"train.steps=20"});
  EXPECT_NE(pf::keep_lr_schedule(longer, m).find("the schedule of a run of 20 steps"), std::string::npos);
  EXPECT_EQ(longer.optim.decay_steps, 0);
  pf::Config chosen = pf::Config::from_toml_string("", {"train.steps=20", "optim.decay_steps=20"});
  EXPECT_NE(pf::keep_lr_schedule(chosen, m).find("optim.decay_steps = 20"), std::string::npos);
}

// Issue 34, the fuzz pass: a refresh record's integer fields must be integers of their range
// (nlohmann casts 1e23 or 1.5 to an integer with undefined behaviour: found by fuzz_refresh_record).
TEST(Hardening, RefreshRecordIntegersAreCheckedIntegers) {
  auto record = [](const std::string& use_step, const std::string& side) {
    return R"({"format": "pipefisher-refresh", "version": 1, "steps": 4, "plan_start": 0, "period": 1,
               "recorded_with": {}, "layout": {}, "splits": [], "events": [{"layer": "l", "side": )" + side +
           R"(, "block": -1, "use_step": )" + use_step + R"(, "curv_step": 0, "pi_step": -1}]})";
  };
  EXPECT_EQ(pf::read_refresh_record(file("r0.json", record("2", "0")).string(), "kfac.refresh_record").events.size(), 1u);
  expect_refused([&] { pf::read_refresh_record(file("r1.json", record("105555555555555555555555", "0")).string(), "kfac.refresh_record"); },
                 "kfac.refresh_record: '");
  expect_refused([&] { pf::read_refresh_record(file("r2.json", record("105555555555555555555555", "0")).string(), "kfac.refresh_record"); },
                 "\"use_step\" is not an integer in [");
  expect_refused([&] { pf::read_refresh_record(file("r3.json", record("1.5", "0")).string(), "kfac.refresh_record"); },
                 "\"use_step\" is not an integer");
  expect_refused([&] { pf::read_refresh_record(file("r4.json", record("2", "4294967296")).string(), "kfac.refresh_record"); },
                 "\"side\" is not an integer in [-2147483648, 2147483647]");
  expect_refused([&] { pf::read_refresh_record(file("r5.json", record("18446744073709551615", "0")).string(), "kfac.refresh_record"); },
                 "\"use_step\" is not an integer");
}

}  // namespace
