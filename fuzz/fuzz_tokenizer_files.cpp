// Tokenizer files (data/wordpiece.hpp, data/bpe.hpp): the first byte picks a BERT vocab.txt or a
// GPT-2 pair (encoder.json, a NUL byte, vocab.bpe); a loaded tokenizer encodes and decodes a text.
#include "data/bpe.hpp"
#include "data/wordpiece.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in = pf_fuzz::as_text(data + 1, size - 1);
  pf_fuzz::refuse_or_accept([&] {
    std::unique_ptr<pf::Tokenizer> tok;
    if (data[0] & 1) {
      const std::string path = pf_fuzz::write_input(data + 1, size - 1, ".vocab.txt");
      tok = std::make_unique<pf::WordPieceTokenizer>(pf::WordPieceTokenizer::load(path));
    } else {
      const size_t cut = std::min(in.find('\0'), in.size());
      const std::string enc = pf_fuzz::write_input(data + 1, cut, ".encoder.json");
      const size_t rest = cut < in.size() ? cut + 1 : in.size();
      const std::string bpe = pf_fuzz::write_input(data + 1 + rest, in.size() - rest, ".vocab.bpe");
      tok = std::make_unique<pf::Gpt2Tokenizer>(pf::Gpt2Tokenizer::load(enc, bpe));
    }
    const std::vector<int32_t> ids = tok->encode("Call me Ishmael. Some years ago\xe2\x80\x94never mind how long!");
    (void)tok->decode(ids);
  });
  return 0;
}
