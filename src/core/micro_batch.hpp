#pragma once
// One micro-batch of input data. Every pipeline stage sees the same MicroBatch (each rank builds
// it from the token file by its global sequence index), so it carries what any block may need:
// token ids for the embedding, the padding mask for attention, the targets for the head.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pf {

struct MicroBatch {
  int index = 0;                     // micro-batch number within the step (0..N-1)
  int rows = 0;                      // sequences
  int seq = 0;                       // tokens per sequence
  std::vector<int32_t> tokens;       // [rows*seq] input ids
  std::vector<int32_t> token_types;  // [rows*seq] BERT segment ids (all 0 here)
  std::vector<uint8_t> attn_mask;    // [rows*seq] 1 = real token, 0 = padding (BERT)
  std::vector<int32_t> labels;       // [rows*seq] target id, -1 = no loss at this position
  // The head multiplies this micro-batch's summed token losses by loss_scale. The trainer sets it
  // to 1 / (loss positions in the whole global step), so the step's loss is a mean over the
  // global batch however it is cut into replicas and micro-batches.
  float loss_scale = 1.0f;
  // BERT next-sentence prediction (data.nsp): per sequence 0 = segment B follows A in its
  // document, 1 = B is from another document (Hugging Face's next_sentence_label), -1 = no NSP
  // loss. The head adds nsp_scale x the summed NSP losses; the trainer sets nsp_scale to
  // 1 / (labelled sequences in the global step), so the step's loss is HF BertForPreTraining's
  // mean masked-LM loss + mean next-sentence loss.
  std::vector<int32_t> nsp_labels;   // [rows]
  float nsp_scale = 0.0f;

  int64_t nsp_sequences() const {
    int64_t n = 0;
    for (int32_t l : nsp_labels) n += (l >= 0);
    return n;
  }

  int64_t loss_positions() const {
    int64_t n = 0;
    for (int32_t l : labels) n += (l >= 0);
    return n;
  }
  // Sizes every vector for rows x seq (set-up time: reserve for the largest micro-batch).
  void resize(int r, int s) {
    rows = r;
    seq = s;
    size_t n = static_cast<size_t>(r) * s;
    tokens.resize(n);
    token_types.resize(n);
    attn_mask.resize(n);
    labels.resize(n);
    nsp_labels.resize(static_cast<size_t>(r), -1);
  }
};

}  // namespace pf
