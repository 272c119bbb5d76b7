#pragma once
// What the batchers need to know about a vocabulary without loading it: its size and the ids of
// its special tokens (test_data checks these against the real vocabulary files).
#include "config/enums.hpp"

#include <string>

namespace pf {

struct VocabInfo {
  const char* name;
  int size;
  int pad, unk, cls, sep, mask;  // -1 where the vocabulary has no such token
  int eot;                       // GPT-2's <|endoftext|>
};

inline constexpr VocabInfo kBertVocab{"bert", 30522, 0, 100, 101, 102, 103, -1};
inline constexpr VocabInfo kGpt2Vocab{"gpt2", 50257, -1, -1, -1, -1, -1, 50256};

// data.vocab's sizes and special tokens.
const VocabInfo& vocab_info(Vocab v);

}  // namespace pf
