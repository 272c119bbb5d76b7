#include "data/batches.hpp"

#include "core/error.hpp"
#include "data/seq_rng.hpp"
#include "data/token_file.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <utility>

namespace pf {
namespace {
// SeqRng purposes, so the permutation and the masks draw unrelated streams from one seed.
constexpr uint64_t kShuffleStream = 1;
constexpr uint64_t kMaskStream = 2;

// Window strides, checked before any window arithmetic.
int64_t gpt_stride(int seq_len) {
  if (seq_len < 1) usage_error("model.seq_len", "{} must be positive", seq_len);
  return seq_len;
}
int64_t bert_stride(int seq_len) {
  if (seq_len < 3) usage_error("model.seq_len", "{} leaves no room for text between [CLS] and [SEP]", seq_len);
  return seq_len - 2;
}
}  // namespace

void mask_positions(int32_t* tok, int32_t* labels, int* candidates, int count, int n_mask, SeqRng& rng,
                    const VocabInfo& vocab) {
  // n_mask distinct candidates by a partial Fisher-Yates shuffle.
  for (int j = 0; j < n_mask; ++j) {
    std::swap(candidates[j], candidates[j + static_cast<int>(rng.below(static_cast<uint64_t>(count - j)))]);
    const int q = candidates[j];
    labels[q] = tok[q];
    const double u = rng.uniform();
    if (u < 0.8) tok[q] = vocab.mask;
    else if (u < 0.9) tok[q] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab.size)));
  }
}

const VocabInfo& vocab_info(Vocab v) { return v == Vocab::Gpt2 ? kGpt2Vocab : kBertVocab; }

WindowOrder::WindowOrder(int64_t n_tokens, int64_t stride, int64_t extra, bool shuffle, uint64_t seed,
                         const std::string& source, int64_t stored_limit)
    : n_(n_tokens), stride_(stride), windows_(stride > 0 ? (n_tokens - extra) / stride : 0), shuffle_(shuffle),
      stored_(windows_ <= stored_limit), seed_(seed) {
  PF_CHECK(stride > 0, "window stride {} must be positive", stride);
  if (windows_ < 1)
    usage_error(source, "has {} tokens, fewer than one sequence needs ({})", n_tokens, stride + extra);
  if (shuffle_ && stored_) perm_.resize(static_cast<size_t>(windows_));
  half_bits_ = (std::bit_width(static_cast<uint64_t>(windows_ - 1)) + 1) / 2;
}

int64_t WindowOrder::feistel_window(int64_t epoch, int64_t k) const {
  const uint64_t key = SeqRng::keyed(seed_, kShuffleStream, static_cast<uint64_t>(epoch)).next();
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t v = static_cast<uint64_t>(k);
  do {  // 2^(2 half_bits) < 4 windows_: under 4 passes on average
    uint64_t left = v >> half_bits_, right = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = SeqRng::mix(key ^ (round * 0x9e3779b97f4a7c15ull) ^ right) & mask;
      left = std::exchange(right, left ^ f);
    }
    v = (left << half_bits_) | right;
  } while (v >= static_cast<uint64_t>(windows_));
  return static_cast<int64_t>(v);
}

int64_t WindowOrder::start(int64_t sequence) {
  PF_CHECK(sequence >= 0, "negative sequence index {}", sequence);
  if (!shuffle_) return (sequence % (n_ / std::gcd(n_, stride_))) * stride_ % n_;  // i*T mod N without overflow
  const int64_t epoch = sequence / windows_;
  if (!stored_) return feistel_window(epoch, sequence % windows_) * stride_;
  if (epoch != epoch_) {
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    SeqRng rng = SeqRng::keyed(seed_, kShuffleStream, static_cast<uint64_t>(epoch));
    for (int64_t k = windows_ - 1; k > 0; --k)
      std::swap(perm_[k], perm_[static_cast<int64_t>(rng.below(static_cast<uint64_t>(k + 1)))]);
    epoch_ = epoch;
  }
  return perm_[sequence % windows_] * stride_;
}

GptBatcher::GptBatcher(Tokens tokens, int seq_len, bool shuffle, uint64_t seed,
                       const std::string& source)
    : tokens_(std::move(tokens)), seq_(seq_len),
      order_(tokens_.size(), gpt_stride(seq_len), 1, shuffle, seed, source) {}

void GptBatcher::fill(int64_t first_sequence, int rows, MicroBatch& out) {
  out.resize(rows, seq_);
  const int64_t n = tokens_.size();
  for (int r = 0; r < rows; ++r) {
    int64_t p = order_.start(first_sequence + r);
    const size_t row = static_cast<size_t>(r) * seq_;
    for (int k = 0; k < seq_; ++k) {
      out.tokens[row + k] = tokens_[p];
      p = (p + 1 == n) ? 0 : p + 1;
      out.labels[row + k] = tokens_[p];
    }
  }
  std::fill(out.attn_mask.begin(), out.attn_mask.end(), uint8_t{1});
  std::fill(out.token_types.begin(), out.token_types.end(), 0);
  std::fill(out.nsp_labels.begin(), out.nsp_labels.end(), -1);
}

BertMlmBatcher::BertMlmBatcher(Tokens tokens, int seq_len, bool shuffle, uint64_t seed,
                               float mask_prob, const VocabInfo& vocab, const std::string& source)
    : tokens_(std::move(tokens)), seq_(seq_len), seed_(seed), vocab_(vocab),
      order_(tokens_.size(), bert_stride(seq_len), 0, shuffle, seed, source) {
  if (!(mask_prob >= 0.0f && mask_prob <= 1.0f)) usage_error("data.mask_prob", "{} is not in [0, 1]", mask_prob);
  if (vocab.cls < 0 || vocab.sep < 0 || vocab.mask < 0)
    usage_error("data.vocab", "'{}' has no [CLS]/[SEP]/[MASK] tokens; BERT needs the bert vocabulary", vocab.name);
  n_mask_ = pf::masked_per_sequence(seq_len, mask_prob);  // the free function, not the member
  positions_.resize(static_cast<size_t>(seq_len - 2));
}

void BertMlmBatcher::fill(int64_t first_sequence, int rows, MicroBatch& out) {
  out.resize(rows, seq_);
  const int64_t n = tokens_.size();
  const int body = seq_ - 2;
  for (int r = 0; r < rows; ++r) {
    const int64_t sequence = first_sequence + r;
    int32_t* tok = out.tokens.data() + static_cast<size_t>(r) * seq_;
    int32_t* lab = out.labels.data() + static_cast<size_t>(r) * seq_;
    int64_t p = order_.start(sequence);
    tok[0] = vocab_.cls;
    for (int k = 1; k <= body; ++k) {
      tok[k] = tokens_[p];
      p = (p + 1 == n) ? 0 : p + 1;
    }
    tok[seq_ - 1] = vocab_.sep;
    std::fill(lab, lab + seq_, -1);
    SeqRng rng = SeqRng::keyed(seed_, kMaskStream, static_cast<uint64_t>(sequence));
    std::iota(positions_.begin(), positions_.end(), 1);
    mask_positions(tok, lab, positions_.data(), body, n_mask_, rng, vocab_);
  }
  std::fill(out.attn_mask.begin(), out.attn_mask.end(), uint8_t{1});
  std::fill(out.token_types.begin(), out.token_types.end(), 0);
  std::fill(out.nsp_labels.begin(), out.nsp_labels.end(), -1);
}


std::unique_ptr<Batcher> make_batcher(const ModelConfig& model, const DataConfig& data, bool validation) {
  const std::string key = validation ? "data.valid_file" : "data.train_file";
  const std::string& file = validation ? data.valid_file : data.train_file;
  if (file.empty()) usage_error(key, "no token file given (make one with scripts/prepare-data.sh)");
  const VocabInfo& vocab = vocab_info(data.vocab);
  if (model.vocab < vocab.size)
    usage_error("model.vocab", "{} is smaller than the {} vocabulary ({})", model.vocab, vocab.name, vocab.size);
  Tokens tokens = map_token_file(file, vocab.size, key);
  const bool shuffle = data.shuffle && !validation;
  if (causal_lm(model.arch)) return std::make_unique<GptBatcher>(std::move(tokens), model.seq_len, shuffle, data.seed, file);
  if (model.arch == Arch::Bert && data.nsp) {
    auto docs = read_doc_index(doc_index_path(file), tokens.size(), key);
    return std::make_unique<BertNspBatcher>(std::move(tokens), std::move(docs), model.seq_len, shuffle, data.seed,
                                            data.mask_prob, vocab, file);
  }
  if (model.arch == Arch::Bert)
    return std::make_unique<BertMlmBatcher>(std::move(tokens), model.seq_len, shuffle, data.seed, data.mask_prob,
                                            vocab, file);
  usage_error("model.arch", "unknown architecture '{}' (expected bert, gpt or llama)", model.arch);
}

void fill_step(Batcher& batcher, int64_t step, int rows, std::vector<MicroBatch>& mbs) {
  const int64_t global = static_cast<int64_t>(mbs.size()) * rows;
  int64_t positions = 0, pairs = 0;
  for (size_t j = 0; j < mbs.size(); ++j) {
    batcher.fill(step * global + static_cast<int64_t>(j) * rows, rows, mbs[j]);
    mbs[j].index = static_cast<int>(j);
    positions += mbs[j].loss_positions();
    pairs += mbs[j].nsp_sequences();
  }
  const float scale = positions > 0 ? 1.0f / static_cast<float>(positions) : 0.0f;
  const float nsp_scale = pairs > 0 ? 1.0f / static_cast<float>(pairs) : 0.0f;
  for (MicroBatch& mb : mbs) mb.loss_scale = scale, mb.nsp_scale = nsp_scale;
}

EvalScales eval_scales(Batcher& valid, int batches, int rows, MicroBatch& mb) {
  int64_t positions = 0, pairs = 0;
  for (int b = 0; b < batches; ++b) {
    valid.fill(static_cast<int64_t>(b) * rows, rows, mb);
    positions += mb.loss_positions();
    pairs += mb.nsp_sequences();
  }
  return {positions > 0 ? 1.0f / static_cast<float>(positions) : 0.0f, pairs > 0 ? 1.0f / static_cast<float>(pairs) : 0.0f};
}

}  // namespace pf
