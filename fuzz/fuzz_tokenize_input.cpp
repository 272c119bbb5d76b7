// `pipefisher tokenize --in FILE`'s input: any bytes, read as the command reads them, tokenized as
// a corpus with the real BERT and GPT-2 vocabularies. Text that is not UTF-8 is refused (a
// UsageError); any other must give what the tokenizer.hpp promises: the ids of encoding the text
// whole, in the vocabulary, and document starts rising strictly from 0 inside the ids.
#include "data/text_util.hpp"
#include "data/tokenizer.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto bert = pf::load_tokenizer("bert", PF_SOURCE_DIR "/data/vocab");
  static const auto gpt2 = pf::load_tokenizer("gpt2", PF_SOURCE_DIR "/data/vocab");
  const std::string path = pf_fuzz::write_input(data, size, ".txt");
  for (const auto* tok : {bert.get(), gpt2.get()})
    pf_fuzz::refuse_or_accept([&] {
      const std::string text = pf::read_text_file(path, "the input text");
      const pf::TokenizedCorpus corpus = pf::tokenize_documents(*tok, text, path);
      if (corpus.ids != tok->encode(text)) __builtin_trap();
      for (int32_t id : corpus.ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
      const auto& starts = corpus.doc_starts;
      if (starts.empty() || starts.front() != 0) __builtin_trap();
      for (size_t i = 1; i < starts.size(); ++i)
        if (starts[i] <= starts[i - 1] || starts[i] >= static_cast<int64_t>(corpus.ids.size())) __builtin_trap();
    });
  return 0;
}
