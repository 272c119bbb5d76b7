// Arbitrary bytes (invalid UTF-8 included) through the real BERT and GPT-2 tokenizers; decoding
// the ids must not fail either.
#include "data/tokenizer.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto bert = pf::load_tokenizer("bert", PF_SOURCE_DIR "/data/vocab");
  static const auto gpt2 = pf::load_tokenizer("gpt2", PF_SOURCE_DIR "/data/vocab");
  const std::string_view text = pf_fuzz::as_text(data, size);
  for (const auto* tok : {bert.get(), gpt2.get()})
    pf_fuzz::refuse_or_accept([&] {  // invalid UTF-8 is refused with a UsageError
      const std::vector<int32_t> ids = tok->encode(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
      (void)tok->decode(ids);
    });
  return 0;
}
