// BertNspBatcher: BERT's sentence pairs for next-sentence prediction (data/batches.hpp).
#include "core/error.hpp"
#include "data/batches.hpp"

#include <algorithm>
#include <cmath>

namespace pf {
namespace {
constexpr uint64_t kNspStream = 3;  // SeqRng purposes: 1 shuffle, 2 masks (batches.cpp)
constexpr uint64_t kMaskStream = 2;
constexpr double kShortSeqProb = 0.1;

// bert-base-uncased ids of '.', '!' and '?': a sentence ends after one of them.
bool ends_sentence(uint16_t id) { return id == 1012 || id == 999 || id == 1029; }

BertNspBatcher::Sentences split_sentences(const Tokens& tokens, const std::vector<int64_t>& doc_starts,
                                          const std::string& source) {
  if (doc_starts.size() < 2)
    usage_error(source, "has {} document(s) in its index: next-sentence prediction draws random sentences from "
                "another document", doc_starts.size());
  BertNspBatcher::Sentences s;
  const int64_t n = tokens.size();
  for (size_t d = 0; d < doc_starts.size(); ++d) {
    const int64_t begin = doc_starts[d], end = d + 1 < doc_starts.size() ? doc_starts[d + 1] : n;
    s.doc_first.push_back(static_cast<int64_t>(s.doc.size()));
    for (int64_t t = begin; t < end; ++t)
      if (t == begin || ends_sentence(tokens[t - 1])) {
        s.start.push_back(t);
        s.doc.push_back(static_cast<int32_t>(d));
      }
  }
  s.start.push_back(n);
  s.doc_first.push_back(static_cast<int64_t>(s.doc.size()));
  return s;
}
}  // namespace

BertNspBatcher::BertNspBatcher(Tokens tokens, std::vector<int64_t> doc_starts, int seq_len,
                               bool shuffle, uint64_t seed, float mask_prob, const VocabInfo& vocab,
                               const std::string& source)
    : tokens_(std::move(tokens)), seq_(seq_len), body_(seq_len - 3), seed_(seed), mask_prob_(mask_prob), vocab_(vocab),
      sent_(split_sentences(tokens_, doc_starts, source)),
      order_(static_cast<int64_t>(sent_.doc.size()), 1, 0, shuffle, seed, source) {
  if (body_ < 2) usage_error("model.seq_len", "{} leaves no room for a sentence pair [CLS] A [SEP] B [SEP]", seq_len);
  if (vocab.cls < 0 || vocab.sep < 0 || vocab.mask < 0 || vocab.pad < 0)
    usage_error("data.vocab", "'{}' has no [CLS]/[SEP]/[MASK]/[PAD] tokens; BERT needs the bert vocabulary", vocab.name);
  positions_.resize(static_cast<size_t>(body_));
}

int64_t BertNspBatcher::gather_end(int64_t first, int64_t want) const {
  const int64_t doc_end = sent_.doc_first[sent_.doc[first] + 1];
  int64_t e = first, len = 0;
  while (e < doc_end && len < want) len += sent_.start[e + 1] - sent_.start[e], ++e;
  return e;
}

int64_t BertNspBatcher::document_of(int64_t token) const {
  const auto it = std::upper_bound(sent_.start.begin(), sent_.start.end(), token);
  return sent_.doc[static_cast<size_t>(it - sent_.start.begin()) - 1];
}

BertNspBatcher::Pair BertNspBatcher::pair(int64_t sequence) {
  SeqRng rng = SeqRng::keyed(seed_, kNspStream, static_cast<uint64_t>(sequence));
  int64_t s = order_.start(sequence);
  const int64_t d = sent_.doc[s], doc_first = sent_.doc_first[d], doc_end = sent_.doc_first[d + 1];
  Pair p;
  // Google's short_seq_prob: 10% of the pairs aim at a random shorter length, so the model also
  // sees short sequences (padding) in pretraining.
  int64_t target = body_;
  if (rng.uniform() < kShortSeqProb) target = 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(body_ - 1)));
  p.next = rng.uniform() < 0.5;
  if (p.next && s + 1 == doc_end) {  // the document's last sentence: start one earlier, if there is one
    if (s > doc_first) --s;
    else p.next = false;
  }
  // The chunk of whole sentences [s, e) that fills the target length, cut after a random number
  // of sentences; a true pair needs two sentences in it.
  int64_t e = gather_end(s, target);
  if (p.next && e - s < 2) e = s + 2;
  const int64_t a_end = e - s >= 2 ? s + 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(e - s - 1))) : e;
  p.a_lo = sent_.start[s];
  p.a_hi = sent_.start[a_end];
  if (p.next) {
    p.b_lo = sent_.start[a_end];
    p.b_hi = sent_.start[e];
  } else {  // B from a random sentence of a random other document, filling what A leaves
    int64_t other = static_cast<int64_t>(rng.below(static_cast<uint64_t>(documents() - 1)));
    if (other >= d) ++other;
    const int64_t o_first = sent_.doc_first[other], o_size = sent_.doc_first[other + 1] - o_first;
    const int64_t bs = o_first + static_cast<int64_t>(rng.below(static_cast<uint64_t>(o_size)));
    p.b_lo = sent_.start[bs];
    p.b_hi = sent_.start[gather_end(bs, std::max<int64_t>(1, target - (p.a_hi - p.a_lo)))];
  }
  // Google's truncate_seq_pair: the longer segment loses a token at its front or back (a coin)
  // until the pair fits.
  while ((p.a_hi - p.a_lo) + (p.b_hi - p.b_lo) > body_) {
    const bool a = p.a_hi - p.a_lo > p.b_hi - p.b_lo;
    int64_t& lo = a ? p.a_lo : p.b_lo;
    int64_t& hi = a ? p.a_hi : p.b_hi;
    if (rng.uniform() < 0.5) ++lo;
    else --hi;
  }
  return p;
}

void BertNspBatcher::fill(int64_t first_sequence, int rows, MicroBatch& out) {
  out.resize(rows, seq_);
  for (int r = 0; r < rows; ++r) {
    const int64_t sequence = first_sequence + r;
    const Pair p = pair(sequence);
    int32_t* tok = out.tokens.data() + static_cast<size_t>(r) * seq_;
    int32_t* lab = out.labels.data() + static_cast<size_t>(r) * seq_;
    int32_t* type = out.token_types.data() + static_cast<size_t>(r) * seq_;
    uint8_t* att = out.attn_mask.data() + static_cast<size_t>(r) * seq_;
    int k = 0, cand = 0;
    auto put = [&](int32_t id, int32_t segment, bool text) {
      if (text) positions_[cand++] = k;
      type[k] = segment;
      att[k] = 1;
      tok[k++] = id;
    };
    put(vocab_.cls, 0, false);
    for (int64_t t = p.a_lo; t < p.a_hi; ++t) put(tokens_[t], 0, true);
    put(vocab_.sep, 0, false);
    for (int64_t t = p.b_lo; t < p.b_hi; ++t) put(tokens_[t], 1, true);
    put(vocab_.sep, 1, false);
    for (; k < seq_; ++k) tok[k] = vocab_.pad, type[k] = 0, att[k] = 0;
    std::fill(lab, lab + seq_, -1);
    SeqRng mrng = SeqRng::keyed(seed_, kMaskStream, static_cast<uint64_t>(sequence));
    const int n_mask = std::clamp(static_cast<int>(std::lround(mask_prob_ * cand)), 1, cand);
    mask_positions(tok, lab, positions_.data(), cand, n_mask, mrng, vocab_);
    out.nsp_labels[r] = p.next ? 0 : 1;
  }
}

}  // namespace pf
