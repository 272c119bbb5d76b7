#include "data/tokenizer.hpp"

#include "config/paths.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "data/bpe.hpp"
#include "data/text_util.hpp"
#include "data/wordpiece.hpp"

#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pf {

std::string read_text_file(const std::string& path, const std::string& what) {
  // An ifstream opens a directory and reads it as empty: refused, not taken for an empty text.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) usage_error(path, "is a directory, not {}", what);
  // A regular file, read whole: text to tokenize is gigabytes at most, and /dev/zero or a FIFO
  // would never end.
  return read_input_file(path, what, size_t{8} << 30);
}

void require_utf8(std::string_view text, const std::string& what) {
  if (const size_t at = first_invalid_utf8(text); at != std::string_view::npos)
    usage_error(what, "invalid UTF-8 near byte {}", at);
}

namespace {

// The file that names a vocabulary's directory (gpt2: the encoder; its merges sit beside it).
std::string vocab_file(const std::string& name) {
  if (name == "bert") return "bert-base-uncased.txt";
  if (name == "gpt2") return "gpt2-encoder.json";
  usage_error("--vocab", "unknown vocabulary '{}' (expected bert or gpt2)", name);
}

}  // namespace

std::vector<std::string> tokenizer_files(const std::string& name, const std::string& vocab_dir) {
  std::vector<std::string> files{vocab_dir + "/" + vocab_file(name)};
  if (name == "gpt2") files.push_back(vocab_dir + "/gpt2-vocab.bpe");
  return files;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name, const std::string& vocab_dir) {
  const std::string file = vocab_dir + "/" + vocab_file(name);
  if (name == "bert") return std::make_unique<WordPieceTokenizer>(WordPieceTokenizer::load(file));
  return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(file, vocab_dir + "/gpt2-vocab.bpe"));
}

std::string find_vocab_dir(const std::string& name, const std::string& token_file) {
  namespace fs = std::filesystem;
  const std::string file = vocab_file(name);
  std::vector<std::string> dirs;
  if (!token_file.empty()) {
    const fs::path near = fs::path(absolute_path(token_file)).parent_path();
    dirs = {near.string(), (near.parent_path() / "vocab").string()};
  }
  for (const std::string& d : data_candidates("vocab")) dirs.push_back(d);
  std::error_code ec;
  for (const std::string& d : dirs)
    if (fs::is_regular_file(fs::path(d) / file, ec)) return d;
  std::string tried;
  for (const std::string& d : dirs) tried += (tried.empty() ? "" : ", ") + d;
  usage_error("--vocab-dir", "no {} vocabulary ({}) in {}: name its directory with --vocab-dir DIR "
              "(scripts/fetch-data.sh downloads it into the repository's data/vocab)", name, file, tried);
}

std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, std::string_view text) {
  return tokenize_documents(tok, text).ids;
}

TokenizedCorpus tokenize_documents(const Tokenizer& tok, std::string_view text, const std::string& what) {
  require_utf8(text, what);
  // Pieces of about this many bytes, cut where the tokenizer says a cut changes nothing; also
  // cut just after every blank line, where a document starts.
  constexpr size_t kPiece = 1 << 16;
  std::vector<std::pair<size_t, size_t>> pieces;
  std::vector<bool> starts_doc;  // [piece]
  bool doc = true;
  for (size_t start = 0; start < text.size();) {
    size_t next_doc = text.size();  // after the next blank line that is a safe cut
    for (size_t pos = start, blank; (blank = text.find("\n\n", pos)) != std::string_view::npos; pos = blank + 1)
      if (tok.safe_cut(text, blank + 2)) {
        next_doc = blank + 2;
        break;
      }
    size_t end = start + kPiece;
    if (next_doc <= end) {
      end = next_doc;
    } else {
      while (end < text.size() && !tok.safe_cut(text, end)) ++end;
      end = std::min(end, text.size());
    }
    pieces.emplace_back(start, end);
    starts_doc.push_back(doc);
    doc = end == next_doc;
    start = end;
  }
  std::vector<std::vector<int32_t>> ids(pieces.size());
  std::vector<std::exception_ptr> errors(pieces.size());
#pragma omp parallel
  {
    auto st = tok.new_state();
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < pieces.size(); ++i) {
      try {
        tok.encode_append(text.substr(pieces[i].first, pieces[i].second - pieces[i].first), ids[i], *st);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  }
  for (auto& e : errors)  // the first failing piece in text order, whatever the thread timing
    if (e) std::rethrow_exception(e);
  size_t total = 0;
  for (auto& v : ids) total += v.size();
  TokenizedCorpus out;
  out.ids.reserve(total);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t at = static_cast<int64_t>(out.ids.size());
    if (starts_doc[i] && !ids[i].empty() && (out.doc_starts.empty() || out.doc_starts.back() < at))
      out.doc_starts.push_back(at);
    out.ids.insert(out.ids.end(), ids[i].begin(), ids[i].end());
  }
  if (out.doc_starts.empty() || out.doc_starts.front() != 0) out.doc_starts.insert(out.doc_starts.begin(), 0);
  return out;
}

}  // namespace pf
