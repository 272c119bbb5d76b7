// pipefisher tokenize: text -> token ids with the BERT or GPT-2 vocabulary.
//   pipefisher tokenize --vocab bert "Hello world!"            prints 101 7592 2088 999 102
//   pipefisher tokenize --vocab gpt2 --in a.txt --out a.bin    writes a token file
//   pipefisher tokenize --vocab gpt2 --decode "15496 995"      prints Hello world
// A corpus file is tokenized as one text (equal to encoding it whole; pieces are cut at newlines
// only where that changes nothing, and run in parallel): BERT without [CLS]/[SEP] (the batcher adds
// them per window), GPT-2 with the raw text, newlines included, and no <|endoftext|>. With --docs,
// also the document index (data/token_file.hpp) that next-sentence prediction draws pairs from.
#include "command.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "data/text_util.hpp"
#include "data/token_file.hpp"
#include "data/tokenizer.hpp"
#include "data/wordpiece.hpp"

#include <fmt/format.h>

#include <charconv>
#include <memory>

namespace pf::app {
namespace {

struct TokenizeArgs {
  std::string vocab;
  std::string vocab_dir;  // "": data/vocab here or in the program's source tree (find_vocab_dir)
  std::string in, out, docs;
  std::string text;
  bool no_special = false;
  bool decode = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t')) ++p;
    if (p == end) break;
    int32_t v;
    auto [q, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || q == p) usage_error("TEXT", "--decode expects integer ids, got '{}'", std::string(p, end));
    ids.push_back(v);
    p = q;
  }
  return ids;
}

int run(const TokenizeArgs& a) {
  if (a.in.empty() != a.out.empty()) usage_error(a.in.empty() ? "--out" : "--in", "--in and --out go together");
  if (!a.in.empty() && !a.text.empty()) usage_error("TEXT", "give either TEXT or --in/--out, not both");
  if (a.decode && !a.in.empty()) usage_error("--decode", "works on TEXT ids, not on files");
  if (!a.docs.empty() && a.out.empty()) usage_error("--docs", "goes with --in/--out");
  if (!a.out.empty() && (a.out.size() < 5 || a.out.compare(a.out.size() - 4, 4, ".bin") != 0))
    usage_error("--out", "token files end in .bin, got '{}'", a.out);
  const OutputFile out{a.out, "--out", true}, docs{a.docs, "--docs", true};
  const std::string vocab_dir = a.vocab_dir.empty() ? find_vocab_dir(a.vocab) : a.vocab_dir;
  std::vector<NamedPath> inputs{{a.in, "--in"}};
  for (const std::string& f : tokenizer_files(a.vocab, vocab_dir)) inputs.push_back({f, "the " + a.vocab + " vocabulary"});
  check_outputs({out, docs}, inputs);
  auto tok = load_tokenizer(a.vocab, vocab_dir);
  if (a.decode) {
    fmt::print("{}\n", tok->decode(parse_ids(a.text)));
    return 0;
  }
  if (a.in.empty()) {
    auto* bert = dynamic_cast<WordPieceTokenizer*>(tok.get());
    auto ids = bert && !a.no_special ? bert->encode_with_special(a.text) : tok->encode(a.text);
    fmt::print("{}\n", fmt::join(ids, " "));
    return 0;
  }
  if (tok->vocab_size() > kMaxTokenFileVocab)
    usage_error("--vocab", "{} has {} entries; token files hold at most {}", a.vocab, tok->vocab_size(),
                kMaxTokenFileVocab);
  const std::string text = read_text_file(a.in, "the input text");
  const TokenizedCorpus corpus = tokenize_documents(*tok, text, a.in);
  write_token_file(out, corpus.ids, tok->vocab_size());
  if (!a.docs.empty()) write_doc_index(docs, corpus.doc_starts);
  fmt::print(stderr, "tokenize: {} bytes -> {} {} tokens in {}{}\n", text.size(), corpus.ids.size(), a.vocab, a.out,
             a.docs.empty() ? "" : fmt::format(", {} document starts in {}", corpus.doc_starts.size(), a.docs));
  return 0;
}

Runner setup(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("--vocab", a->vocab, "Vocabulary: bert (bert-base-uncased WordPiece) or gpt2 (byte-level BPE)")
      ->required()
      ->check(CLI::IsMember({"bert", "gpt2"}));
  app.add_option("--vocab-dir", a->vocab_dir,
                 "Directory with the vocabulary files (default: data/vocab here, else in the program's source "
                 "tree; scripts/fetch-data.sh downloads them)");
  app.add_option("--in", a->in, "Text file to tokenize (with --out)");
  app.add_option("--out", a->out, "Token file to write (.bin, little-endian uint16 ids)");
  app.add_option("--docs", a->docs,
                 "Also write where each document (text between blank lines) starts: one token offset per line "
                 "(BERT's next-sentence pairs need it: X.docs beside X.bin)");
  app.add_flag("--no-special", a->no_special, "BERT: print TEXT's ids without [CLS] and [SEP]");
  app.add_flag("--decode", a->decode, "TEXT holds ids: print the text they decode to");
  app.add_option("text", a->text, "Text to tokenize (ids are printed space-separated)");
  return [a] { return run(*a); };
}

}  // namespace

PF_COMMAND(tokenize, "tokenize", "Tokenize text or a corpus file with the BERT or GPT-2 vocabulary", setup)

}  // namespace pf::app
