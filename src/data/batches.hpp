#pragma once
// Training and validation batches from a token file. Sequence i of a run is a pure function of
// (token file, seq_len, shuffle, seed, i), so any rank can build any micro-batch and pipeline or
// data-parallel layouts see exactly the data a single process sees.
//
// GPT (causal LM): sequence i reads the window of T+1 tokens starting at start(i); inputs are its
//   first T tokens, targets (labels) the last T. Without shuffling start(i) = i*T and positions
//   wrap around the end of the file (token (i*T + k) mod N).
// BERT (masked LM, no sentence pairs): sequence i is [CLS] + the T-2 tokens at start(i) + [SEP];
//   round(mask_prob * (T-2)) of the T-2 corpus positions (at least one) are selected; each selected
//   one becomes [MASK] with probability 0.8, a uniformly random vocabulary id with 0.1, or stays
//   with 0.1; labels hold the original id there and -1 elsewhere. attn_mask is all 1 (windows are
//   always full), token_types all 0. The choices come from SeqRng keyed by (seed, i).
// BERT with next-sentence prediction (data.nsp, NVIDIA's / Google's create_pretraining_data
//   recipe): the corpus is cut into documents by its index (X.docs beside X.bin) and each document
//   into sentences (a sentence ends after '.', '!' or '?'). Sequence i starts segment A at sentence
//   order(i) (the sentences in a permutation per epoch, as windows above) and is a pair
//   [CLS] A [SEP] B [SEP], padded with [PAD] (attn_mask 0) when short; token_types 0 up to the first
//   [SEP], 1 after. The pair aims at the full length, or (probability 0.1, Google's
//   short_seq_prob) at a random length from 2. With probability 1/2, B is the text that follows A
//   in its document (label 0): the chunk of whole sentences from order(i) filling that length is
//   cut after a random number of sentences (A's start moves back one sentence when it is its
//   document's last); otherwise (label 1) A is that chunk's first sentences and B starts at a
//   random sentence of a random other document. The longer segment then loses tokens at a random end until the pair fits.
//   Masking as above over the A and B tokens (round(mask_prob * their count), at least one). The
//   choices come from SeqRng keyed by (seed, i); a one-sentence document cannot give a next
//   sentence and falls back to a random one.
// Shuffling: the file is cut into W = floor((N - extra) / stride) whole windows (stride T for GPT
//   with one extra target token, T-2 for BERT); epoch e = i / W visits them in a permutation drawn
//   from (seed, e) by Fisher-Yates (for a corpus of more than kStoredPermutationWindows windows,
//   by a keyed bijection instead: below).
#include "config/config.hpp"
#include "core/micro_batch.hpp"
#include "data/seq_rng.hpp"
#include "data/token_file.hpp"
#include "data/vocab_info.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pf {

// Epoch permutations of up to this many windows are stored (Fisher-Yates, above); beyond, a corpus
// too large for an array of its windows (one larger than memory), window k of epoch e is f_e(k)
// for a keyed bijection f_e computed per index and stored nowhere: a 4-round Feistel network on
// the smallest even number of bits covering the windows, applied again until it lands below
// their count (cycle walking). Both are drawn from (seed, e).
constexpr int64_t kStoredPermutationWindows = int64_t{1} << 22;

// Maps a global sequence index to the first token of its window.
class WindowOrder {
 public:
  // `source` names the token file in errors (fewer tokens than one window needs).
  // `stored_limit`: the largest permutation stored (tests use a small one to reach the other).
  WindowOrder(int64_t n_tokens, int64_t stride, int64_t extra, bool shuffle, uint64_t seed, const std::string& source,
              int64_t stored_limit = kStoredPermutationWindows);
  int64_t start(int64_t sequence);
  int64_t windows_per_epoch() const { return windows_; }

 private:
  int64_t feistel_window(int64_t epoch, int64_t k) const;

  int64_t n_, stride_, windows_;
  bool shuffle_, stored_;
  uint64_t seed_;
  int half_bits_ = 0;            // Feistel: bits of each half
  int64_t epoch_ = -1;           // epoch whose permutation perm_ holds
  std::vector<int64_t> perm_;    // sized once
};

class Batcher {
 public:
  virtual ~Batcher() = default;
  // Fills `out` with sequences first_sequence .. first_sequence + rows - 1 (rows in order). `out`
  // keeps its capacity: size it once with out.resize(max_rows, seq_len()) and no call allocates.
  virtual void fill(int64_t first_sequence, int rows, MicroBatch& out) = 0;
  virtual int seq_len() const = 0;
  virtual int64_t sequences_per_epoch() const = 0;
};

class GptBatcher final : public Batcher {
 public:
  GptBatcher(Tokens tokens, int seq_len, bool shuffle, uint64_t seed, const std::string& source);
  void fill(int64_t first_sequence, int rows, MicroBatch& out) override;
  int seq_len() const override { return seq_; }
  int64_t sequences_per_epoch() const override { return order_.windows_per_epoch(); }

 private:
  Tokens tokens_;
  int seq_;
  WindowOrder order_;
};

class BertMlmBatcher final : public Batcher {
 public:
  BertMlmBatcher(Tokens tokens, int seq_len, bool shuffle, uint64_t seed, float mask_prob,
                 const VocabInfo& vocab, const std::string& source);
  void fill(int64_t first_sequence, int rows, MicroBatch& out) override;
  int seq_len() const override { return seq_; }
  int64_t sequences_per_epoch() const override { return order_.windows_per_epoch(); }
  int masked_per_sequence() const { return n_mask_; }

 private:
  Tokens tokens_;
  int seq_;
  uint64_t seed_;
  VocabInfo vocab_;
  int n_mask_;
  WindowOrder order_;
  std::vector<int> positions_;  // scratch for choosing masked positions, sized once
};

class BertNspBatcher final : public Batcher {
 public:
  // doc_starts: the document index (read_doc_index); `source` names the token file in errors.
  BertNspBatcher(Tokens tokens, std::vector<int64_t> doc_starts, int seq_len, bool shuffle,
                 uint64_t seed, float mask_prob, const VocabInfo& vocab, const std::string& source);
  void fill(int64_t first_sequence, int rows, MicroBatch& out) override;
  int seq_len() const override { return seq_; }
  int64_t sequences_per_epoch() const override { return order_.windows_per_epoch(); }
  int64_t sentences() const { return static_cast<int64_t>(sent_.doc.size()); }
  int64_t documents() const { return static_cast<int64_t>(sent_.doc_first.size()) - 1; }
  // Sequence i's segments as corpus token ranges [lo, hi) (each within one document), after
  // truncation, and whether B follows A (label 0).
  struct Pair {
    int64_t a_lo = 0, a_hi = 0, b_lo = 0, b_hi = 0;
    bool next = false;
  };
  Pair pair(int64_t sequence);
  // The document holding corpus token t.
  int64_t document_of(int64_t token) const;

  // The corpus cut into sentences, grouped by document.
  struct Sentences {
    std::vector<int64_t> start;      // [sentence + 1] first token; last = tokens
    std::vector<int32_t> doc;        // [sentence] its document
    std::vector<int64_t> doc_first;  // [document + 1] first sentence; last = sentences
  };

 private:
  // The sentence after the last of those from `first` on, within its document, that together
  // hold `want` tokens (or up to the document's end).
  int64_t gather_end(int64_t first, int64_t want) const;

  Tokens tokens_;
  int seq_, body_;  // body_: text tokens of a full pair, seq_len - 3
  uint64_t seed_;
  float mask_prob_;
  VocabInfo vocab_;
  Sentences sent_;
  WindowOrder order_;            // over sentences: where segment A starts
  std::vector<int> positions_;   // scratch: masking candidates, sized once
};

// BERT's masking of `n_mask` of the `count` positions in candidates[] (reordered): each becomes
// [MASK] with probability 0.8, a random id with 0.1, or stays; labels hold the original id there.
void mask_positions(int32_t* tok, int32_t* labels, int* candidates, int count, int n_mask, SeqRng& rng,
                    const VocabInfo& vocab);

// The batcher a run uses: reads data.train_file (or data.valid_file when `validation`), checks its
// ids against the data.vocab size, and picks GPT or BERT batches by model.arch. The validation
// batcher never shuffles, so every evaluation sees the same held-out sequences (and masks).
// UsageError naming the key or file on a missing file, a vocabulary/arch mismatch, or too few tokens.
std::unique_ptr<Batcher> make_batcher(const ModelConfig& model, const DataConfig& data, bool validation);

// Fills the step's micro-batches from `batcher` and sets each one's loss_scale to 1 / (loss
// positions in the whole step). `mbs` must hold count micro-batches sized for rows x seq.
void fill_step(Batcher& batcher, int64_t step, int rows, std::vector<MicroBatch>& mbs);
// Validation: the loss scales of the `batches` held-out micro-batches of `rows` sequences (the
// same ones every evaluation), 1 / (masked positions) and 1 / (NSP sequences) over all of them,
// so that the summed forward losses are the mean masked-LM loss (+ the mean NSP loss). Uses mb.
struct EvalScales {
  float loss = 0, nsp = 0;
};
EvalScales eval_scales(Batcher& valid, int batches, int rows, MicroBatch& mb);

}  // namespace pf
