#include "io/safetensors.hpp"
#include "nn/model.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace pf;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pf_test_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A file written by hand: length field (the header's own length unless overridden), header, data.
std::string write_raw(const std::string& path, const std::string& header, const std::string& data,
                      int64_t length_field = -1) {
  uint64_t n = length_field < 0 ? header.size() : static_cast<uint64_t>(length_field);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

std::string floats(std::initializer_list<float> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(float));
}

// The UsageError message of f(), or "" if it did not throw one.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

Param make_param(const std::string& name, Shape shape, float start) {
  Param p(name, shape);
  for (int64_t i = 0; i < p.value.numel(); ++i) p.value[i] = start + static_cast<float>(i);
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

}  // namespace

TEST_F(Safetensors, ExactByteLayoutOfATinyFile) {
  Param a = make_param("a", {2, 3}, 0.0f);
  Param w = make_param("h.0.attn.c_attn.weight", {2, 3}, 10.0f);  // ours [out=2, in=3]
  w.hf_transposed = true;
  Param b = make_param("b", {1}, -1.5f);
  save_safetensors(file("t.safetensors"), {&a, &w, &b}, {{"format", "pt"}});

  std::string bytes = read_bytes(file("t.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("h.0.attn.c_attn.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[24,48]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[48,52]}})";
  const size_t padded = (expected_header.size() + 7) / 8 * 8;
  ASSERT_EQ(n, padded);
  ASSERT_EQ(bytes.size(), 8 + padded + 52);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header, expected_header + std::string(padded - expected_header.size(), ' '));
  EXPECT_EQ(nlohmann::json::parse(header),
            nlohmann::json::parse(expected_header));  // parses, padding included
  // Data: a as is, w transposed to [in, out], b.
  EXPECT_EQ(bytes.substr(8 + n), floats({0, 1, 2, 3, 4, 5, 10, 13, 11, 14, 12, 15, -1.5f}));
}

TEST_F(Safetensors, MetadataFormatIsPtUnlessGivenAndTheGenericWriterAddsNothing) {
  Param a = make_param("a", {2}, 1.0f);
  save_safetensors(file("t.safetensors"), {&a});
  EXPECT_EQ(SafetensorsReader(file("t.safetensors")).metadata(), (SafetensorsMetadata{{"format", "pt"}}));
  save_safetensors(file("t.safetensors"), {&a}, {{"format", "np"}, {"step", "7"}});
  EXPECT_EQ(SafetensorsReader(file("t.safetensors")).metadata(),
            (SafetensorsMetadata{{"format", "np"}, {"step", "7"}}));

  write_safetensors(file("g.safetensors"), {{"x", {2}, a.value.span()}});
  std::string bytes = read_bytes(file("g.safetensors"));
  EXPECT_EQ(bytes.substr(8, 55), R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )");
  SafetensorsReader r(file("g.safetensors"));
  EXPECT_TRUE(r.metadata().empty());
  ASSERT_EQ(r.tensors().size(), 1u);
}

TEST_F(Safetensors, RoundTripIsBitExactIncludingTransposedAndSpecialValues) {
  Param emb = make_param("transformer.wte.weight", {5, 4}, 0.25f);
  Param conv = make_param("transformer.h.0.mlp.c_fc.weight", {3, 4}, 0.0f);  // [out, in]
  conv.hf_transposed = true;
  Param bias = make_param("transformer.h.0.mlp.c_fc.bias", {3}, 0.0f);
  bias.value[0] = -0.0f;
  bias.value[1] = std::numeric_limits<float>::denorm_min();
  bias.value[2] = std::bit_cast<float>(0x7fc12345u);  // NaN with a payload
  conv.value[5] = std::numeric_limits<float>::infinity();
  conv.value[7] = 1.0f / 3.0f;
  Param mirror = emb;  // the LM head's copy of the tied embedding: not written twice
  mirror.mirror = true;
  save_safetensors(file("m.safetensors"), {&emb, &conv, &bias, &mirror}, {{"format", "pt"}});

  SafetensorsReader r(file("m.safetensors"));
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.find("transformer.h.0.mlp.c_fc.weight")->shape, (Shape{4, 3}));

  Param emb2("transformer.wte.weight", {5, 4}), conv2("transformer.h.0.mlp.c_fc.weight", {3, 4});
  Param bias2("transformer.h.0.mlp.c_fc.bias", {3}), mirror2("transformer.wte.weight", {5, 4});
  conv2.hf_transposed = true;
  mirror2.mirror = true;
  // The format carries special values; only the weights' policy (require_finite) refuses them.
  auto res = load_safetensors(file("m.safetensors"), {&emb2, &conv2, &bias2, &mirror2}, {true, true, false});
  EXPECT_EQ(res.loaded.size(), 4u);
  EXPECT_TRUE(res.unused.empty());
  EXPECT_TRUE(same_bits(emb.value, emb2.value));
  EXPECT_TRUE(same_bits(conv.value, conv2.value));
  EXPECT_TRUE(same_bits(bias.value, bias2.value));
  EXPECT_TRUE(same_bits(emb.value, mirror2.value));
  EXPECT_FALSE(fs::exists(file("m.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST_F(Safetensors, SubsetLoadForAPipelineStage) {
  Param a = make_param("bert.encoder.layer.0.output.dense.weight", {2, 2}, 1.0f);
  Param b = make_param("bert.encoder.layer.1.output.dense.weight", {2, 2}, 5.0f);
  save_safetensors(file("s.safetensors"), {&a, &b});

  Param b2("bert.encoder.layer.1.output.dense.weight", {2, 2});
  auto res = load_safetensors(file("s.safetensors"), {&b2});  // unused tensors allowed by default
  EXPECT_TRUE(same_bits(b.value, b2.value));
  EXPECT_EQ(res.unused, std::vector<std::string>{"bert.encoder.layer.0.output.dense.weight"});

  std::string msg = error_of([&] {
    load_safetensors(file("s.safetensors"), {&b2}, {.require_all = true, .allow_unused = false});
  });
  EXPECT_NE(msg.find("bert.encoder.layer.0.output.dense.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("matches no parameter"), std::string::npos) << msg;

  Param c("cls.predictions.bias", {4});
  msg = error_of([&] { load_safetensors(file("s.safetensors"), {&b2, &c}); });
  EXPECT_NE(msg.find("'cls.predictions.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  res = load_safetensors(file("s.safetensors"), {&b2, &c}, {.require_all = false});
  EXPECT_EQ(res.missing, std::vector<std::string>{"cls.predictions.bias"});
  EXPECT_EQ(res.loaded, std::vector<std::string>{"bert.encoder.layer.1.output.dense.weight"});
}

TEST_F(Safetensors, WrongShapeIsRefusedNamingFileAndTensorAndNothingChanges) {
  Param a = make_param("a", {2, 3}, 1.0f);
  Param w = make_param("w", {2, 3}, 1.0f);
  save_safetensors(file("s.safetensors"), {&a, &w});

  Param a2("a", {2, 3}), w2("w", {3, 2});
  a2.value.fill(7.0f);
  std::string msg = error_of([&] { load_safetensors(file("s.safetensors"), {&a2, &w2}); });
  EXPECT_NE(msg.find(file("s.safetensors")), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2,3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3,2]"), std::string::npos) << msg;
  EXPECT_EQ(a2.value[0], 7.0f);  // refused before anything was loaded

  // A Conv1D weight saved untransposed has the wrong layout for an hf_transposed Param.
  Param t("a", {2, 3});
  t.hf_transposed = true;
  msg = error_of([&] { load_safetensors(file("s.safetensors"), {&t}, {.require_all = false}); });
  EXPECT_NE(msg.find("Conv1D"), std::string::npos) << msg;
}

TEST_F(Safetensors, HalfAndBfloat16AreConvertedOnLoad) {
  // F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), inf, 0x3555; BF16: 1, -3.5, tiny.
  uint16_t f16[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x3555};
  uint16_t bf16[] = {0x3F80, 0xC060, 0x0081};
  std::string data(reinterpret_cast<const char*>(f16), sizeof f16);
  data += std::string(reinterpret_cast<const char*>(bf16), sizeof bf16);
  write_raw(file("h.safetensors"),
            R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},)"
            R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[12,18]}})",
            data);
  Param h("h", {6}), b("b", {3});
  load_safetensors(file("h.safetensors"), {&h, &b}, {true, true, false});
  EXPECT_EQ(h.value[0], 1.0f);
  EXPECT_EQ(h.value[1], -2.0f);
  EXPECT_EQ(h.value[2], 65504.0f);
  EXPECT_EQ(h.value[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h.value[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h.value[5], 0.333251953125f);
  EXPECT_EQ(b.value[0], 1.0f);
  EXPECT_EQ(b.value[1], -3.5f);
  EXPECT_EQ(std::bit_cast<uint32_t>(b.value[2]), 0x00810000u);
}

// As weights (the default), a NaN or Inf is refused naming the file, the tensor and the element,
// in every floating dtype, an F64 beyond float's range included, and no Param is touched.
TEST_F(Safetensors, NonFiniteWeightsAreRefused) {
  const uint16_t f16[] = {0x3C00, 0x7E00};          // 1, NaN
  const uint16_t bf16[] = {0x3F80, 0x3F80, 0xFF80};  // 1, 1, -inf
  const double f64[] = {1.0, 1e300};                // 1e300 is inf as fp32
  const std::string raw[] = {std::string(reinterpret_cast<const char*>(f16), sizeof f16),
                             std::string(reinterpret_cast<const char*>(bf16), sizeof bf16),
                             std::string(reinterpret_cast<const char*>(f64), sizeof f64)};
  const char* dtype[] = {"F16", "BF16", "F64"};
  const char* want[] = {"(nan at index 1)", "(-inf at index 2)", "(inf at index 1)"};
  for (int k = 0; k < 3; ++k) {
    const int64_t n = static_cast<int64_t>(raw[k].size() / (k == 2 ? 8 : 2));
    write_raw(file("nf.safetensors"), fmt::format(R"({{"w":{{"dtype":"{}","shape":[{}],"data_offsets":[0,{}]}}}})",
                                                  dtype[k], n, raw[k].size()),
              raw[k]);
    Param w("w", {n});
    const std::string msg = error_of([&] { load_safetensors(file("nf.safetensors"), {&w}); });
    EXPECT_EQ(msg, file("nf.safetensors") + ": tensor 'w' holds a non-finite value " + want[k] +
                       ": weights and training state must be finite") << dtype[k];
    EXPECT_EQ(w.value[0], 0.0f) << dtype[k];
  }
}

TEST_F(Safetensors, GenericReaderListsEveryDtypeAndRefusesIntegersAsParams) {
  write_raw(file("i.safetensors"),
            R"({"bert.embeddings.position_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]},)"
            R"("x":{"dtype":"F32","shape":[],"data_offsets":[16,20]}})",
            std::string(16, '\0') + floats({2.5f}));
  SafetensorsReader r(file("i.safetensors"));
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "bert.embeddings.position_ids");
  EXPECT_EQ(r.tensors()[0].dtype, "I64");
  EXPECT_EQ(r.tensors()[0].bytes.size(), 16u);
  EXPECT_EQ(r.tensors()[1].shape, Shape{});
  Param x("x", Shape{});
  load_safetensors(file("i.safetensors"), {&x}, {.require_all = true, .allow_unused = true});
  EXPECT_EQ(x.value[0], 2.5f);
  Param p("bert.embeddings.position_ids", {1, 2});
  std::string msg = error_of([&] { load_safetensors(file("i.safetensors"), {&p}); });
  EXPECT_NE(msg.find("I64"), std::string::npos) << msg;
}

// ---- malformed files: each refused with a message naming the file and the fault ----

struct BadFile {
  const char* what;
  std::string header;
  std::string data;
  int64_t length_field;
  const char* expect;  // in the message
};

TEST_F(Safetensors, MalformedFilesAreRefusedClearly) {
  const std::string six = floats({1, 2, 3, 4, 5, 6});
  const std::vector<BadFile> cases = {
      {"unknown dtype", R"({"a":{"dtype":"F13","shape":[6],"data_offsets":[0,24]}})", six, -1,
       "unknown dtype 'F13'"},
      {"header length beyond the file", R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", six, 1000,
       "header length 1000 exceeds"},
      {"header length of 2^64-1", R"({})", "", -2, "exceeds"},
      {"truncated body", R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})", six.substr(0, 20), -1,
       "overrun the data buffer of 20 bytes"},
      {"offsets beyond the data", R"({"a":{"dtype":"F32","shape":[6],"data_offsets":[4,28]}})", six, -1,
       "overrun"},
      {"overlapping tensors",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       six, -1, "overlap"},
      {"gap between tensors",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
       six, -1, "gap"},
      {"offsets inconsistent with shape", R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,24]}})", six, -1,
       "needs 20"},
      {"dtype size inconsistent", R"({"a":{"dtype":"F64","shape":[6],"data_offsets":[0,24]}})", six, -1,
       "needs 48"},
      {"huge shape", R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,24]}})", six, -1,
       "more than the file"},
      {"reversed offsets", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[24,0]}})", six, -1, "reversed"},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[-6],"data_offsets":[0,24]}})", six, -1,
       "negative dimension"},
      {"data left over", R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}})", six, -1,
       "data buffer has 24 bytes but the tensors cover 20"},
      {"not JSON", "not json at all!", six, -1, "not valid JSON"},
      {"JSON but not an object", "[1, 2, 3]", six, -1, "not a JSON object"},
      {"duplicate names",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"a":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}})",
       six, -1, "duplicate name 'a'"},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[6]}})", six, -1, "data_offsets"},
      {"metadata not strings", R"({"__metadata__":{"step":3}})", "", -1, "not a string"},
  };
  for (const auto& c : cases) {
    std::string path = file("bad.safetensors");
    write_raw(path, c.header, c.data, c.length_field == -2 ? 0 : c.length_field);
    if (c.length_field == -2) {  // length field all ones
      std::string bytes = read_bytes(path);
      std::memset(bytes.data(), 0xff, 8);
      std::ofstream(path, std::ios::binary) << bytes;
    }
    std::string msg = error_of([&] { SafetensorsReader r(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    // load_safetensors goes through the same checks.
    Param a("a", {6});
    EXPECT_FALSE(error_of([&] { load_safetensors(path, {&a}); }).empty()) << c.what;
  }
}

TEST_F(Safetensors, ShortMissingAndTruncatedFilesAreRefused) {
  std::ofstream(file("short.safetensors")) << "abc";
  EXPECT_NE(error_of([&] { SafetensorsReader r(file("short.safetensors")); }).find("too short"), std::string::npos);
  std::ofstream(file("empty.safetensors")).flush();
  EXPECT_NE(error_of([&] { SafetensorsReader r(file("empty.safetensors")); }).find("too short"), std::string::npos);
  EXPECT_NE(error_of([&] { SafetensorsReader r(file("absent.safetensors")); }).find("cannot open"),
            std::string::npos);

  // A real file cut at every length is refused (never read past its end).
  Param a = make_param("a", {3, 2}, 1.0f), b = make_param("b", {4}, 0.0f);
  save_safetensors(file("full.safetensors"), {&a, &b});
  std::string bytes = read_bytes(file("full.safetensors"));
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::ofstream(file("cut.safetensors"), std::ios::binary) << bytes.substr(0, len);
    EXPECT_FALSE(error_of([&] { SafetensorsReader r(file("cut.safetensors")); }).empty()) << len;
  }
}

TEST_F(Safetensors, SaveIntoAMissingDirectoryIsAUsageErrorAndLeavesNothing) {
  Param a = make_param("a", {2}, 1.0f);
  std::string msg = error_of([&] { save_safetensors(file("no/such/dir/x.safetensors"), {&a}); });
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(file("no")));
}

TEST_F(Safetensors, SaveReplacesAnExistingFileAtomically) {
  Param a = make_param("a", {2}, 1.0f);
  save_safetensors(file("x.safetensors"), {&a});
  a.value.fill(9.0f);
  save_safetensors(file("x.safetensors"), {&a});
  Param a2("a", {2});
  load_safetensors(file("x.safetensors"), {&a2});
  EXPECT_EQ(a2.value[1], 9.0f);
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir_)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);  // no temporary left behind
}

TEST_F(Safetensors, MutatedHeadersAreAcceptedConsistentlyOrRefusedAsUsageErrors) {
  Param a = make_param("a", {3, 2}, 1.0f), b = make_param("bb", {4}, 0.0f);
  save_safetensors(file("full.safetensors"), {&a, &b});
  const std::string good = read_bytes(file("full.safetensors"));
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull, state >> 33; };
  const char digits[] = "0123456789,[]{}\" ";
  int accepted = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = good;
    for (int k = 0; k < 1 + trial % 3; ++k)  // 1-3 header bytes replaced by JSON-ish characters
      bytes[8 + next() % n] = digits[next() % (sizeof digits - 1)];
    std::ofstream(file("mut.safetensors"), std::ios::binary) << bytes;
    try {
      SafetensorsReader r(file("mut.safetensors"));
      ++accepted;
      uint64_t data_size = bytes.size() - 8 - n, covered = 0;
      for (const auto& e : r.tensors()) {
        EXPECT_LE(e.end, data_size) << trial;
        EXPECT_EQ(e.bytes.size(), e.end - e.begin) << trial;
        covered += e.end - e.begin;
      }
      EXPECT_EQ(covered, data_size) << trial;
    } catch (const UsageError&) {
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations only touch padding or digits of equal meaning
}

// A saved BERT is Hugging Face's BertForPreTraining: the masked-LM model's tensors plus the pooler
// and the next-sentence head (with or without data.nsp), and another model loads it back by
// those names, tensor for tensor.
TEST_F(Safetensors, BertWeightsAreBertForPreTrainingsAndLoadByName) {
  for (bool nsp : {false, true}) {
    ModelConfig c;
    c.layers = 2;
    c.hidden = 16;
    c.heads = 2;
    c.ffn = 32;
    c.seq_len = 8;
    c.max_position = 16;
    c.vocab = 50;
    c.nsp = nsp;
    auto m = build_model(c, 0, num_blocks(c) - 1);
    m->init(5);
    std::vector<const Param*> params;
    for (Param* p : m->params()) params.push_back(p);
    save_safetensors(file("bert.safetensors"), params);
    SafetensorsReader r(file("bert.safetensors"));
    std::map<std::string, Shape> shapes;
    for (const auto& e : r.tensors()) shapes[e.name] = e.shape;
    // embeddings 5, 16 per layer, the MLM head 5 (transform dense + LayerNorm, decoder bias), the
    // pooler 2 and the NSP head 2; the decoder weight is the tied word embedding.
    EXPECT_EQ(shapes.size(), 5u + 16u * 2 + 5 + 2 + 2);
    EXPECT_EQ(shapes["bert.pooler.dense.weight"], (Shape{16, 16}));
    EXPECT_EQ(shapes["bert.pooler.dense.bias"], (Shape{16}));
    EXPECT_EQ(shapes["cls.seq_relationship.weight"], (Shape{2, 16}));
    EXPECT_EQ(shapes["cls.seq_relationship.bias"], (Shape{2}));
    EXPECT_EQ(shapes.count("cls.predictions.decoder.weight"), 0u);
    auto other = build_model(c, 0, num_blocks(c) - 1);
    other->init(6);
    load_safetensors(file("bert.safetensors"), other->params());
    for (Param* p : other->params()) EXPECT_TRUE(same_bits(p->value, m->find_param(p->name)->value)) << p->name;
  }
}
