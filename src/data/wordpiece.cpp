#include "data/wordpiece.hpp"

#include "core/error.hpp"
#include "data/text_util.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

namespace pf {
namespace {

constexpr int kMaxWordChars = 100;  // HF's max_input_chars_per_word

bool is_cjk(int32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}
// HF _is_whitespace, plus the separators Python's str.split() also splits on (Zl, Zp).
bool is_space(int32_t c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
  if (c < 0x80) return false;
  auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}
// HF _is_control (tab, newline and carriage return are whitespace, not control).
bool is_control(int32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c < 0x80) return c < 0x20 || c == 0x7F;
  auto cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CN ||
         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS;
}
// BERT's punctuation: every non-alphanumeric printable ASCII character (so $ + < = > ^ ` | ~
// count too) and everything in the Unicode P* categories.
bool is_punct(int32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  if (c < 0x80) return false;
  auto cat = utf8proc_category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}
bool is_letter(int32_t c) {
  auto cat = utf8proc_category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

struct BertState : EncodeState {
  std::vector<int32_t> cps;   // code points of the current whitespace-delimited token
  std::vector<int32_t> norm;  // ... lower-cased, accents stripped
  std::string word;           // one punctuation-free word, UTF-8
  std::vector<uint32_t> cut;  // byte offset of each code point of `word`, plus its end
  std::string key;            // "##" + piece lookup buffer
  std::string utf8;           // scratch for NFD
};

// Python's str.lower() then NFD with non-spacing marks removed (HF's _run_strip_accents).
void lower_strip_accents(const std::vector<int32_t>& in, BertState& st) {
  st.norm.clear();
  bool ascii = std::all_of(in.begin(), in.end(), [](int32_t c) { return c < 0x80; });
  if (ascii) {
    for (int32_t c : in) st.norm.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  st.utf8.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    int32_t c = in[i];
    int32_t lc = utf8proc_tolower(c);
    // Python applies Unicode's Final_Sigma rule: capital sigma ending a word becomes final sigma.
    if (c == 0x03A3 && i > 0 && is_letter(in[i - 1]) && (i + 1 == in.size() || !is_letter(in[i + 1]))) lc = 0x03C2;
    append_utf8(st.utf8, lc);
  }
  utf8proc_uint8_t* nfd = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(st.utf8.data()),
                        static_cast<utf8proc_ssize_t>(st.utf8.size()), &nfd,
                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  PF_CHECK(n >= 0, "utf8proc_map failed: {}", utf8proc_errmsg(n));
  for (utf8proc_ssize_t p = 0; p < n;) {
    int32_t c;
    p += utf8proc_iterate(nfd + p, n - p, &c);
    if (utf8proc_category(c) != UTF8PROC_CATEGORY_MN) st.norm.push_back(c);
  }
  std::free(nfd);
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::load(const std::string& path) {
  std::string text =
      read_text_file(path, "the BERT vocabulary (scripts/fetch-data.sh downloads it; --vocab-dir names its directory)");
  WordPieceTokenizer t;
  size_t p = 0;
  while (p < text.size()) {
    size_t e = text.find('\n', p);
    if (e == std::string::npos) e = text.size();
    std::string tok = text.substr(p, e - p);
    if (!t.ids_.emplace(tok, static_cast<int>(t.tokens_.size())).second)
      usage_error(path, "malformed vocabulary: token '{}' appears twice (line {})", tok, t.tokens_.size() + 1);
    t.tokens_.push_back(std::move(tok));
    p = e + 1;
  }
  if (t.tokens_.empty()) usage_error(path, "malformed vocabulary: the file is empty");
  auto need = [&](const char* s) {
    int id = t.id(s);
    if (id < 0) usage_error(path, "malformed vocabulary: no {} token (truncated file?)", s);
    return id;
  };
  t.pad_ = need("[PAD]");
  t.unk_ = need("[UNK]");
  t.cls_ = need("[CLS]");
  t.sep_ = need("[SEP]");
  t.mask_ = need("[MASK]");
  return t;
}

int WordPieceTokenizer::id(std::string_view token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::unique_ptr<EncodeState> WordPieceTokenizer::new_state() const { return std::make_unique<BertState>(); }

// Greedy longest-match-first over one word (HF's WordpieceTokenizer.tokenize).
void WordPieceTokenizer::wordpiece(std::string_view word, const std::vector<uint32_t>& cut, std::string& key,
                                   std::vector<int32_t>& out) const {
  const int n = static_cast<int>(cut.size()) - 1;
  if (n > kMaxWordChars) {
    out.push_back(unk_);
    return;
  }
  const size_t first = out.size();
  for (int start = 0; start < n;) {
    int end = n, found = -1;
    for (; end > start; --end) {
      std::string_view piece = word.substr(cut[start], cut[end] - cut[start]);
      if (start > 0) {
        key.assign("##");
        key.append(piece);
        piece = key;
      }
      auto it = ids_.find(piece);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // no piece matches the rest: the whole word is unknown
      out.resize(first);
      out.push_back(unk_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

void WordPieceTokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, EncodeState& state) const {
  auto& st = static_cast<BertState&>(state);
  require_utf8(text, "text");  // as GPT-2's: invalid bytes are refused, not dropped
  // One basic token (whitespace-delimited, after cleaning) -> lower/strip -> punctuation split
  // -> WordPiece for each word.
  auto flush_word = [&] {
    if (st.cut.size() > 1) wordpiece(st.word, st.cut, st.key, out);
    st.word.clear();
    st.cut.assign(1, 0);
  };
  auto flush_token = [&] {
    if (st.cps.empty()) return;
    lower_strip_accents(st.cps, st);
    st.cps.clear();
    st.word.clear();
    st.cut.assign(1, 0);
    for (int32_t c : st.norm) {
      if (is_punct(c)) {
        flush_word();
        append_utf8(st.word, c);
        st.cut.push_back(static_cast<uint32_t>(st.word.size()));
        flush_word();
      } else if (is_space(c)) {  // NFD can produce a space (U+2001 -> U+2003)
        flush_word();
      } else {
        append_utf8(st.word, c);
        st.cut.push_back(static_cast<uint32_t>(st.word.size()));
      }
    }
    flush_word();
  };
  for_each_code_point(text, [&](int32_t c) {
    if (c == 0 || c == 0xFFFD || is_control(c)) return;  // HF _clean_text drops these
    if (is_space(c)) {
      flush_token();
    } else if (is_cjk(c)) {  // HF _tokenize_chinese_chars: each ideograph is its own token
      flush_token();
      st.cps.push_back(c);
      flush_token();
    } else {
      st.cps.push_back(c);
    }
  });
  flush_token();
}

std::vector<int32_t> WordPieceTokenizer::encode_with_special(std::string_view text) const {
  std::vector<int32_t> out{cls_};
  auto st = new_state();
  encode_append(text, out, *st);
  out.push_back(sep_);
  return out;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int32_t id : encode(text)) out.push_back(tokens_[id]);
  return out;
}

std::string WordPieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      usage_error("token id", "{} is outside the BERT vocabulary (size {})", id, vocab_size());
    if (id == pad_ || id == cls_ || id == sep_) continue;
    const std::string& t = tokens_[id];
    if (!s.empty() && t.size() >= 2 && t.compare(0, 2, "##") == 0) {
      s.append(t, 2);
    } else {
      if (!s.empty()) s.push_back(' ');
      s += t;
    }
  }
  // HF's clean_up_tokenization, in its order.
  static const std::pair<const char*, const char*> kCleanup[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kCleanup) replace_all(s, from, to);
  return s;
}

bool WordPieceTokenizer::safe_cut(std::string_view text, size_t cut) const {
  // Whitespace separates basic tokens, so any newline is a safe place to cut.
  return cut > 0 && cut <= text.size() && text[cut - 1] == '\n';
}

}  // namespace pf
