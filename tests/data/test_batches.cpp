// GPT windows and BERT masked-LM batches: exact contents, masking statistics, determinism and
// independence from how sequences are cut into micro-batches.
#include "core/error.hpp"
#include "data/batches.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>

namespace pf {
namespace {

std::vector<uint16_t> iota_tokens(int n, int offset = 0) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(offset + i);
  return t;
}

// A pseudo-corpus over the BERT vocabulary avoiding the special ids.
std::vector<uint16_t> bert_corpus(int n) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(1000 + (i * 7919) % 20000);
  return t;
}

bool same_batch(const MicroBatch& a, const MicroBatch& b) {
  return a.rows == b.rows && a.seq == b.seq && a.tokens == b.tokens && a.labels == b.labels &&
         a.attn_mask == b.attn_mask && a.token_types == b.token_types;
}

// fill(first, a + b) equals fill(first, a) followed by fill(first + a, b).
void expect_split_invariant(Batcher& batcher, int64_t first, int a, int b) {
  const int t = batcher.seq_len();
  MicroBatch whole, p1, p2;
  batcher.fill(first, a + b, whole);
  batcher.fill(first, a, p1);
  batcher.fill(first + a, b, p2);
  std::vector<int32_t> tokens = p1.tokens, labels = p1.labels;
  tokens.insert(tokens.end(), p2.tokens.begin(), p2.tokens.end());
  labels.insert(labels.end(), p2.labels.begin(), p2.labels.end());
  EXPECT_EQ(whole.tokens, tokens);
  EXPECT_EQ(whole.labels, labels);
  EXPECT_EQ(whole.tokens.size(), static_cast<size_t>((a + b) * t));
}

TEST(GptBatches, ConsecutiveWindowsWithoutShuffle) {
  const int T = 16;
  GptBatcher b(iota_tokens(1000), T, false, 7, "test");
  MicroBatch mb;
  b.fill(0, 4, mb);
  ASSERT_EQ(mb.rows, 4);
  ASSERT_EQ(mb.seq, T);
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < T; ++k) {
      EXPECT_EQ(mb.tokens[r * T + k], r * T + k);
      EXPECT_EQ(mb.labels[r * T + k], r * T + k + 1);
      EXPECT_EQ(mb.attn_mask[r * T + k], 1);
      EXPECT_EQ(mb.token_types[r * T + k], 0);
    }
  b.fill(10, 1, mb);  // sequence 10 = tokens [160, 176]
  EXPECT_EQ(mb.tokens[0], 160);
  EXPECT_EQ(mb.labels[T - 1], 176);
}

TEST(GptBatches, WrapsAroundTheEndOfTheFile) {
  const int T = 16, N = 100;
  GptBatcher b(iota_tokens(N), T, false, 7, "test");
  MicroBatch mb;
  b.fill(6, 2, mb);  // sequence 6 starts at 96, sequence 7 at 112 mod 100 = 12
  for (int k = 0; k < T; ++k) {
    EXPECT_EQ(mb.tokens[k], (96 + k) % N);
    EXPECT_EQ(mb.labels[k], (97 + k) % N);
    EXPECT_EQ(mb.tokens[T + k], (12 + k) % N);
  }
  b.fill(6 + 25, 1, mb);  // i*T mod N has period N / gcd(N, T) = 25
  EXPECT_EQ(mb.tokens[0], 96);
}

TEST(GptBatches, ShuffleVisitsEveryWindowOncePerEpoch) {
  const int T = 8, N = 1001;  // (N - 1) / T = 125 windows
  GptBatcher b(iota_tokens(N), T, true, 3, "test");
  ASSERT_EQ(b.sequences_per_epoch(), 125);
  MicroBatch mb;
  std::vector<std::vector<int>> epochs(2);
  for (int e = 0; e < 2; ++e) {
    b.fill(e * 125, 125, mb);
    std::set<int> starts;
    for (int r = 0; r < 125; ++r) {
      starts.insert(mb.tokens[r * T]);
      epochs[e].push_back(mb.tokens[r * T]);
      for (int k = 0; k < T; ++k) EXPECT_EQ(mb.labels[r * T + k], mb.tokens[r * T + k] + 1);
    }
    EXPECT_EQ(starts.size(), 125u);
    EXPECT_EQ(*starts.begin(), 0);
    EXPECT_EQ(*starts.rbegin(), 124 * T);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  std::vector<int> in_order(125);
  for (int i = 0; i < 125; ++i) in_order[i] = i * T;
  EXPECT_NE(epochs[0], in_order);
}

// Issue 20 item 12: past kStoredPermutationWindows windows (a corpus larger than memory) an epoch's
// order is a keyed bijection computed per index; it too visits every window once per epoch, in
// an order that depends on the seed and the epoch. Below the limit the stored permutation is
// unchanged (the test above).
TEST(WindowOrders, UnstoredPermutationVisitsEveryWindowOncePerEpoch) {
  const int64_t T = 8, W = 1000;  // not a power of two: the bijection walks past the end
  WindowOrder a(W * T + 1, T, 1, true, 3, "test", /*stored_limit=*/10), same(W * T + 1, T, 1, true, 3, "test", 10),
      other_seed(W * T + 1, T, 1, true, 4, "test", 10);
  ASSERT_EQ(a.windows_per_epoch(), W);
  std::vector<std::vector<int64_t>> epochs(2);
  for (int64_t e = 0; e < 2; ++e) {
    std::set<int64_t> seen;
    for (int64_t i = e * W; i < (e + 1) * W; ++i) {
      const int64_t s = a.start(i);
      EXPECT_EQ(s % T, 0);
      EXPECT_EQ(s, same.start(i));
      seen.insert(s / T);
      epochs[e].push_back(s / T);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(W));
    EXPECT_EQ(*seen.rbegin(), W - 1);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  std::vector<int64_t> in_order(W), seeded(W);
  std::iota(in_order.begin(), in_order.end(), 0);
  for (int64_t i = 0; i < W; ++i) seeded[i] = other_seed.start(i) / T;
  EXPECT_NE(epochs[0], in_order);
  EXPECT_NE(epochs[0], seeded);
}

TEST(GptBatches, DeterministicAndSplitInvariant) {
  GptBatcher a(iota_tokens(5000), 32, true, 11, "test"), b(iota_tokens(5000), 32, true, 11, "test"),
      c(iota_tokens(5000), 32, true, 12, "test");
  MicroBatch ma, mb, mc;
  a.fill(100, 8, ma);
  b.fill(100, 8, mb);
  c.fill(100, 8, mc);
  EXPECT_TRUE(same_batch(ma, mb));
  EXPECT_NE(ma.tokens, mc.tokens);
  expect_split_invariant(a, 0, 4, 4);
  expect_split_invariant(a, 150, 3, 5);  // crosses the epoch boundary at 156
}

TEST(GptBatches, TooShortFileIsAUsageError) {
  EXPECT_THROW(GptBatcher(iota_tokens(16), 16, false, 1, "short.bin"), UsageError);  // needs 17
  EXPECT_NO_THROW(GptBatcher(iota_tokens(17), 16, false, 1, "ok.bin"));
  EXPECT_THROW(GptBatcher(iota_tokens(17), 0, false, 1, "ok.bin"), UsageError);
  EXPECT_THROW(BertMlmBatcher(iota_tokens(17), 2, false, 1, 0.15f, kBertVocab, "ok.bin"), UsageError);
  EXPECT_THROW(BertMlmBatcher(iota_tokens(7), 10, false, 1, 0.15f, kBertVocab, "short.bin"), UsageError);
}

TEST(BertBatches, WindowsAreWrappedInClsSep) {
  const int T = 10;
  BertMlmBatcher b(bert_corpus(1000), T, false, 5, 0.15f, kBertVocab, "test");
  const auto corpus = bert_corpus(1000);
  MicroBatch mb;
  b.fill(3, 2, mb);
  for (int r = 0; r < 2; ++r) {
    const int32_t* tok = &mb.tokens[r * T];
    const int32_t* lab = &mb.labels[r * T];
    EXPECT_EQ(tok[0], kBertVocab.cls);
    EXPECT_EQ(tok[T - 1], kBertVocab.sep);
    EXPECT_EQ(lab[0], -1);
    EXPECT_EQ(lab[T - 1], -1);
    int selected = 0;
    for (int k = 1; k < T - 1; ++k) {
      const int32_t original = corpus[(3 + r) * (T - 2) + k - 1];
      if (lab[k] >= 0) {
        ++selected;
        EXPECT_EQ(lab[k], original);
      } else {
        EXPECT_EQ(tok[k], original);
      }
    }
    EXPECT_EQ(selected, 1);  // round(0.15 * 8) = 1
  }
  EXPECT_EQ(std::accumulate(mb.attn_mask.begin(), mb.attn_mask.end(), 0), 2 * T);
}

TEST(BertBatches, MaskingRateAndEightyTenTen) {
  const int T = 128, rows = 4000;
  BertMlmBatcher b(bert_corpus(200000), T, true, 99, 0.15f, kBertVocab, "test");
  ASSERT_EQ(b.masked_per_sequence(), 19);  // round(0.15 * 126)
  MicroBatch mb;
  b.fill(0, rows, mb);
  int64_t selected = 0, masked = 0, unchanged = 0, random = 0;
  std::vector<int> per_position(T, 0);
  for (int r = 0; r < rows; ++r) {
    int in_row = 0;
    for (int k = 0; k < T; ++k) {
      const size_t i = static_cast<size_t>(r) * T + k;
      if (mb.labels[i] < 0) continue;
      ++in_row;
      ++per_position[k];
      if (mb.tokens[i] == kBertVocab.mask) ++masked;
      else if (mb.tokens[i] == mb.labels[i]) ++unchanged;
      else ++random;
    }
    ASSERT_EQ(in_row, 19);
    selected += in_row;
  }
  EXPECT_NEAR(static_cast<double>(selected) / (rows * (T - 2)), 0.15, 0.5 / (T - 2));
  // 76,000 selections: one standard deviation of each share is at most 0.0015.
  EXPECT_NEAR(static_cast<double>(masked) / selected, 0.8, 0.01);
  EXPECT_NEAR(static_cast<double>(random) / selected, 0.1, 0.008);
  EXPECT_NEAR(static_cast<double>(unchanged) / selected, 0.1, 0.008);
  EXPECT_EQ(per_position[0], 0);
  EXPECT_EQ(per_position[T - 1], 0);
  const double mean = static_cast<double>(selected) / (T - 2);  // ~603, sd ~23
  for (int k = 1; k < T - 1; ++k) EXPECT_NEAR(per_position[k], mean, 0.25 * mean) << "position " << k;
}

TEST(BertBatches, DeterministicPerSequenceAndSplitInvariant) {
  const int T = 64;
  BertMlmBatcher a(bert_corpus(50000), T, true, 42, 0.15f, kBertVocab, "test"),
      b(bert_corpus(50000), T, true, 42, 0.15f, kBertVocab, "test"),
      c(bert_corpus(50000), T, true, 43, 0.15f, kBertVocab, "test");
  MicroBatch ma, mb, mc;
  a.fill(0, 8, ma);
  b.fill(0, 8, mb);
  c.fill(0, 8, mc);
  EXPECT_TRUE(same_batch(ma, mb));
  EXPECT_NE(ma.labels, mc.labels);
  expect_split_invariant(a, 0, 4, 4);
  expect_split_invariant(a, 777, 1, 7);
  // Same window, different sequence index: a different mask. Without shuffling, a file of exactly
  // 10 windows gives sequences 0 and 10 the same tokens.
  BertMlmBatcher plain(bert_corpus(62 * 10), T, false, 42, 0.15f, kBertVocab, "test");  // 10 windows
  MicroBatch s0, s10;
  plain.fill(0, 1, s0);
  plain.fill(10, 1, s10);
  std::vector<int32_t> orig0(T), orig10(T);
  for (int k = 0; k < T; ++k) {
    orig0[k] = s0.labels[k] >= 0 ? s0.labels[k] : s0.tokens[k];
    orig10[k] = s10.labels[k] >= 0 ? s10.labels[k] : s10.tokens[k];
  }
  EXPECT_EQ(orig0, orig10);
  EXPECT_NE(s0.labels, s10.labels);
}

TEST(Batches, FillDoesNotReallocate) {
  BertMlmBatcher bert(bert_corpus(20000), 64, true, 1, 0.15f, kBertVocab, "test");
  GptBatcher gpt(iota_tokens(20000), 64, true, 1, "test");
  for (Batcher* b : {static_cast<Batcher*>(&bert), static_cast<Batcher*>(&gpt)}) {
    MicroBatch mb;
    mb.resize(8, 64);
    const int32_t* tokens = mb.tokens.data();
    const int32_t* labels = mb.labels.data();
    for (int step = 0; step < 20; ++step) b->fill(step * 8, step % 2 ? 8 : 4, mb);
    EXPECT_EQ(mb.tokens.data(), tokens);
    EXPECT_EQ(mb.labels.data(), labels);
  }
}

TEST(Batches, MakeBatcherFromConfig) {
  ModelConfig model;
  model.arch = pf::Arch::Bert;
  model.seq_len = 128;
  DataConfig data;
  data.vocab = pf::Vocab::Bert;
  data.train_file = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  data.valid_file = data.train_file;
  auto train = make_batcher(model, data, false);
  EXPECT_EQ(train->seq_len(), 128);
  EXPECT_EQ(train->sequences_per_epoch(), 48847 / 126);
  // The validation batcher reads in order, whatever data.shuffle says.
  auto valid = make_batcher(model, data, true);
  MicroBatch mb;
  valid->fill(0, 1, mb);
  auto ids = std::vector<int32_t>(mb.tokens.begin(), mb.tokens.end());
  EXPECT_EQ(ids[0], kBertVocab.cls);

  data.vocab = pf::Vocab::Gpt2;
  data.train_file = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.gpt2.bin";
  EXPECT_THROW(make_batcher(model, data, false), UsageError);  // BERT needs [CLS]/[SEP]/[MASK]
  model.arch = pf::Arch::Gpt;
  model.vocab = 50257;
  EXPECT_EQ(make_batcher(model, data, false)->sequences_per_epoch(), (49066 - 1) / 128);
  data.train_file.clear();
  EXPECT_THROW(make_batcher(model, data, false), UsageError);
}

}  // namespace
}  // namespace pf

namespace pf {
namespace {

// A corpus of `docs` documents of 1..6 sentences of 2..24 tokens, each ending in '.' (1012);
// every fifth document has a single sentence. Returns the tokens, the document index, and how
// many sentences sit in one-sentence documents (they cannot give a true next sentence).
struct DocCorpus {
  std::vector<uint16_t> tokens;
  std::vector<int64_t> starts;
  int64_t sentences = 0, lonely = 0;
};
DocCorpus doc_corpus(int docs) {
  DocCorpus c;
  uint64_t x = 12345;
  auto rnd = [&](int n) { return static_cast<int>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % n; };
  for (int d = 0; d < docs; ++d) {
    c.starts.push_back(static_cast<int64_t>(c.tokens.size()));
    const int sentences = d % 5 == 0 ? 1 : 1 + rnd(6);
    c.sentences += sentences;
    c.lonely += sentences == 1;
    for (int s = 0; s < sentences; ++s) {
      const int len = 2 + rnd(23);
      for (int k = 0; k + 1 < len; ++k) c.tokens.push_back(static_cast<uint16_t>(2000 + rnd(20000)));
      c.tokens.push_back(1012);
    }
  }
  return c;
}

}  // namespace

// NVIDIA's / Google's pairs: about half the pairs are true next sentences (B follows A in its
// document), the others pair A with text of another document. Over one epoch every sentence
// starts A once; those in one-sentence documents always get a random B, the rest a fair coin:
// the count of true pairs is Binomial(sentences - lonely, 1/2), checked within 4 sigma.
TEST(BertNspBatches, HalfThePairsAreTrueNextSentences) {
  const DocCorpus c = doc_corpus(400);
  BertNspBatcher b(c.tokens, c.starts, 48, true, 7, 0.15f, kBertVocab, "corpus");
  ASSERT_EQ(b.sentences(), c.sentences);
  ASSERT_EQ(b.documents(), 400);
  const int body = 48 - 3;
  int64_t next = 0;
  for (int64_t i = 0; i < c.sentences; ++i) {
    const BertNspBatcher::Pair p = b.pair(i);
    ASSERT_GE(p.a_hi - p.a_lo, 1);
    ASSERT_GE(p.b_hi - p.b_lo, 1);
    ASSERT_LE((p.a_hi - p.a_lo) + (p.b_hi - p.b_lo), body);
    const int64_t da = b.document_of(p.a_lo), db = b.document_of(p.b_lo);
    EXPECT_EQ(da, b.document_of(p.a_hi - 1));  // each segment within one document
    EXPECT_EQ(db, b.document_of(p.b_hi - 1));
    if (p.next) {
      ++next;
      EXPECT_EQ(da, db) << i;
      EXPECT_GE(p.b_lo, p.a_hi) << i;  // B after A (the seam may lose tokens to truncation)
    } else {
      EXPECT_NE(da, db) << i;
    }
  }
  const double n = static_cast<double>(c.sentences - c.lonely);
  EXPECT_NEAR(static_cast<double>(next), n / 2, 4 * std::sqrt(n / 4)) << next << " of " << n;
  EXPECT_GT(n, 1000);
}

// Google's short_seq_prob: in long documents of 2-token sentences, a pair aiming at the full
// length fills it exactly (whole sentences, then truncation); 10% aim at a random length in
// [2, body] and end shorter (unless it lands within a sentence of the body: 2 of 124). Pairs near
// a document's end (its last ~63 sentences of 5000, for A or a random B) come out short too:
// expected share 0.1 x 0.98 + ~0.015, checked within [0.085, 0.135] (4 sigma of the binomial
// over 4000 pairs is 0.019); without the rule it would be ~0.015.
TEST(BertNspBatches, OneInTenPairsIsShorter) {
  std::vector<uint16_t> tokens;
  std::vector<int64_t> starts;
  uint64_t x = 99;
  auto rnd = [&](int n) { return static_cast<int>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % n; };
  for (int d = 0; d < 20; ++d) {
    starts.push_back(static_cast<int64_t>(tokens.size()));
    for (int s = 0; s < 5000; ++s) {
      tokens.push_back(static_cast<uint16_t>(2000 + rnd(20000)));
      tokens.push_back(1012);
    }
  }
  BertNspBatcher b(tokens, starts, 128, true, 11, 0.15f, kBertVocab, "corpus");
  int shorter = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const BertNspBatcher::Pair p = b.pair(i);
    shorter += (p.a_hi - p.a_lo) + (p.b_hi - p.b_lo) < 125;
  }
  EXPECT_GT(shorter / double(n), 0.085) << shorter;
  EXPECT_LT(shorter / double(n), 0.135) << shorter;
}

// The rows: [CLS] A [SEP] B [SEP] [PAD]..., token types 0 then 1, attention off on padding,
// labels where masked (the original ids), NSP labels 0 = next, 1 = random; deterministic per
// sequence, whatever the micro-batch cut.
TEST(BertNspBatches, RowsAreClsASepBSepAndSplitInvariant) {
  const DocCorpus c = doc_corpus(60);
  BertNspBatcher b(c.tokens, c.starts, 40, true, 3, 0.15f, kBertVocab, "corpus");
  MicroBatch mb;
  b.fill(10, 16, mb);
  int masked = 0, text = 0;
  for (int r = 0; r < 16; ++r) {
    const BertNspBatcher::Pair p = b.pair(10 + r);
    EXPECT_EQ(mb.nsp_labels[r], p.next ? 0 : 1);
    std::vector<int32_t> want{kBertVocab.cls}, types{0};
    for (int64_t t = p.a_lo; t < p.a_hi; ++t) want.push_back(c.tokens[t]), types.push_back(0);
    want.push_back(kBertVocab.sep), types.push_back(0);
    for (int64_t t = p.b_lo; t < p.b_hi; ++t) want.push_back(c.tokens[t]), types.push_back(1);
    want.push_back(kBertVocab.sep), types.push_back(1);
    for (int k = 0; k < 40; ++k) {
      const size_t i = static_cast<size_t>(r) * 40 + k;
      const bool real = k < static_cast<int>(want.size());
      EXPECT_EQ(mb.attn_mask[i], real ? 1 : 0);
      EXPECT_EQ(mb.token_types[i], real ? types[k] : 0);
      const int32_t original = mb.labels[i] >= 0 ? mb.labels[i] : mb.tokens[i];
      EXPECT_EQ(original, real ? want[k] : kBertVocab.pad) << r << " " << k;
      masked += mb.labels[i] >= 0;
      if (mb.labels[i] >= 0) EXPECT_TRUE(real && want[k] != kBertVocab.cls && want[k] != kBertVocab.sep);
    }
    text += static_cast<int>(want.size()) - 3;
  }
  EXPECT_NEAR(masked, 0.15 * text, 16);  // round(0.15 x text tokens) per row
  expect_split_invariant(b, 3, 5, 7);
  MicroBatch again;
  b.fill(10, 16, again);
  EXPECT_EQ(again.nsp_labels, mb.nsp_labels);
}

TEST(BertNspBatches, ReadsTheDocumentIndexBesideTheTokenFile) {
  ModelConfig m;
  m.seq_len = 32;
  DataConfig d;
  d.nsp = true;
  d.train_file = PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin";
  d.valid_file = d.train_file;
  auto b = make_batcher(m, d, false);
  auto* nsp = dynamic_cast<BertNspBatcher*>(b.get());
  ASSERT_NE(nsp, nullptr);
  EXPECT_GT(nsp->documents(), 100);
  MicroBatch mb;
  b->fill(0, 8, mb);
  EXPECT_GT(mb.nsp_sequences(), 0);
  const std::filesystem::path alone = pf_test::scratch_dir("batches") / "alone.bin";  // no .docs beside it
  std::filesystem::copy_file(d.train_file, alone, std::filesystem::copy_options::overwrite_existing);
  d.train_file = alone.string();
  try {
    make_batcher(m, d, false);
    FAIL() << "no document index accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("data.train_file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("alone.docs"), std::string::npos) << e.what();
  }
}

}  // namespace pf
