#include "data/bpe.hpp"

#include "core/error.hpp"
#include "data/text_util.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <nlohmann/json.hpp>
#include <pcre2.h>

#include <unordered_set>

namespace pf {
namespace {

// GPT-2's pre-tokenisation pattern (encoder.py), unchanged.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// OpenAI's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in order, so every byte has a visible, non-whitespace character.
std::array<int32_t, 256> bytes_to_unicode() {
  std::array<int32_t, 256> cp{};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? b : 256 + n++;
  }
  return cp;
}

struct Gpt2State : EncodeState {
  pcre2_match_data* md = nullptr;
  std::unordered_map<std::string, std::vector<int32_t>> cache;  // chunk -> ids
  std::vector<int32_t> work;
  explicit Gpt2State(const pcre2_code* re) : md(pcre2_match_data_create_from_pattern(re, nullptr)) {}
  ~Gpt2State() override { pcre2_match_data_free(md); }
};
constexpr size_t kCacheLimit = 1 << 20;  // chunks; cleared when full so memory stays bounded

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t p = 0;
  while (p < text.size()) {
    size_t e = text.find('\n', p);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(p, e - p));
    p = e + 1;
  }
  return lines;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&& o) noexcept
    : encoder_(std::move(o.encoder_)), token_bytes_(std::move(o.token_bytes_)), byte_id_(o.byte_id_),
      merges_(std::move(o.merges_)), eot_(o.eot_), regex_(o.regex_) {
  o.regex_ = nullptr;
}
Gpt2Tokenizer::~Gpt2Tokenizer() { pcre2_code_free(static_cast<pcre2_code*>(regex_)); }

namespace {

// encoder.json: {"token in bytes_to_unicode spelling": id, ...} with ids 0..n-1.
nlohmann::json parse_encoder(const std::string& encoder_json) {
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_text_file(
        encoder_json, "the GPT-2 encoder (scripts/fetch-data.sh downloads it; --vocab-dir names its directory)"));
  } catch (const nlohmann::json::exception& e) {
    usage_error(encoder_json, "malformed JSON ({})", e.what());
  }
  if (!enc.is_object() || enc.empty()) usage_error(encoder_json, "malformed encoder: expected a non-empty JSON object");
  return enc;
}

pcre2_code* compile_pattern() {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  PF_CHECK(re != nullptr, "GPT-2 pattern does not compile (PCRE2 error {} at {})", err, off);
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  return re;
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& encoder_json, const std::string& vocab_bpe) {
  Gpt2Tokenizer t;
  t.read_encoder(encoder_json);
  t.read_merges(vocab_bpe, encoder_json);
  t.regex_ = compile_pattern();
  return t;
}

void Gpt2Tokenizer::read_encoder(const std::string& encoder_json) {
  const auto b2u = bytes_to_unicode();
  std::unordered_map<int32_t, int> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;
  const nlohmann::json enc = parse_encoder(encoder_json);
  token_bytes_.assign(enc.size(), std::string());
  std::vector<bool> seen(enc.size(), false);
  for (auto& [tok, v] : enc.items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(enc.size()))
      usage_error(encoder_json, "malformed encoder: id of '{}' is not an integer in [0, {})", tok, enc.size());
    int id = v.get<int>();
    if (seen[id]) usage_error(encoder_json, "malformed encoder: id {} is used twice", id);
    seen[id] = true;
    std::string bytes;
    bool ok = true;
    for_each_code_point(tok, [&](int32_t c) {
      auto it = u2b.find(c);
      if (it == u2b.end()) ok = false;
      else bytes.push_back(static_cast<char>(it->second));
    });
    if (!ok) usage_error(encoder_json, "malformed encoder: '{}' is not in byte-level spelling", tok);
    token_bytes_[id] = std::move(bytes);
    encoder_.emplace(tok, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string u;
    append_utf8(u, b2u[b]);
    int id = this->id(u);
    if (id < 0) usage_error(encoder_json, "malformed encoder: no token for byte {}", b);
    byte_id_[b] = id;
  }
  eot_ = id("<|endoftext|>");
}

// vocab.bpe: "#version" line, then one merge "left right" per line; rank = order.
void Gpt2Tokenizer::read_merges(const std::string& vocab_bpe, const std::string& encoder_json) {
  auto lines = split_lines(read_text_file(
      vocab_bpe, "the GPT-2 merges (scripts/fetch-data.sh downloads them; --vocab-dir names their directory)"));
  std::unordered_set<int32_t> produced;
  int rank = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.empty() || (i == 0 && l.rfind("#version", 0) == 0)) continue;
    size_t sp = l.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == l.size() || l.find(' ', sp + 1) != std::string::npos)
      usage_error(vocab_bpe, "malformed merge on line {}: '{}' is not two tokens", i + 1, l);
    std::string a = l.substr(0, sp), b = l.substr(sp + 1);
    int ia = id(a), ib = id(b), im = id(a + b);
    if (ia < 0 || ib < 0 || im < 0)
      usage_error(vocab_bpe, "merge on line {} ('{}') uses or makes a token missing from {}", i + 1, l, encoder_json);
    merges_[(static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib)] = {rank++, im};
    produced.insert(im);
  }
  if (merges_.empty()) usage_error(vocab_bpe, "malformed merges: the file has no merge lines");
  // Every multi-byte token must come from a merge, except special tokens such as <|endoftext|>.
  for (const auto& [tok, id] : encoder_) {
    bool special = tok.size() > 4 && tok.rfind("<|", 0) == 0 && tok.compare(tok.size() - 2, 2, "|>") == 0;
    if (token_bytes_[id].size() > 1 && !special && !produced.count(id))
      usage_error(vocab_bpe, "no merge produces token '{}' (id {}): truncated, or not the merges of {}", tok, id,
                  encoder_json);
  }
}

int Gpt2Tokenizer::id(const std::string& token) const {
  auto it = encoder_.find(token);
  return it == encoder_.end() ? -1 : it->second;
}

std::unique_ptr<EncodeState> Gpt2Tokenizer::new_state() const {
  return std::make_unique<Gpt2State>(static_cast<const pcre2_code*>(regex_));
}

// encoder.py's bpe(): repeatedly merge every occurrence (left to right) of the lowest-ranked pair.
void Gpt2Tokenizer::bpe(std::string_view chunk, std::vector<int32_t>& w) const {
  w.clear();
  for (unsigned char c : chunk) w.push_back(byte_id_[c]);
  while (w.size() > 1) {
    int best = INT32_MAX;
    Merge m{};
    int32_t first = 0, second = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merges_.find((static_cast<uint64_t>(w[i]) << 32) | static_cast<uint32_t>(w[i + 1]));
      if (it != merges_.end() && it->second.rank < best) {
        best = it->second.rank;
        m = it->second;
        first = w[i];
        second = w[i + 1];
      }
    }
    if (best == INT32_MAX) break;
    size_t j = 0;
    for (size_t i = 0; i < w.size();) {
      if (i + 1 < w.size() && w[i] == first && w[i + 1] == second) {
        w[j++] = m.merged;
        i += 2;
      } else {
        w[j++] = w[i++];
      }
    }
    w.resize(j);
  }
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, EncodeState& state) const {
  auto& st = static_cast<Gpt2State&>(state);
  auto re = static_cast<const pcre2_code*>(regex_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  require_utf8(text, "text");
  // PCRE2's first match checks the subject's UTF-8 again (a disagreement is a bug: PF_CHECK); later ones need not.
  uint32_t opts = 0;
  for (size_t off = 0; off < text.size();) {
    int rc = pcre2_match(re, subject, text.size(), off, opts, st.md, nullptr);
    PF_CHECK(rc > 0, "GPT-2 pattern failed to match at byte {} (PCRE2 code {})", off, rc);
    opts = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    PF_CHECK(ov[1] > off, "empty match at byte {}", off);
    std::string chunk(text.substr(ov[0], ov[1] - ov[0]));
    auto it = st.cache.find(chunk);
    if (it == st.cache.end()) {
      bpe(chunk, st.work);
      if (st.cache.size() >= kCacheLimit) st.cache.clear();
      it = st.cache.emplace(std::move(chunk), st.work).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
    off = ov[1];
  }
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      usage_error("token id", "{} is outside the GPT-2 vocabulary (size {})", id, vocab_size());
    s += token_bytes_[id];
  }
  return s;
}

bool Gpt2Tokenizer::safe_cut(std::string_view text, size_t cut) const {
  // Cut just before a '\n' that is followed by a visible ASCII character. In the whole text the
  // whitespace run ending in that '\n' splits there: \s+(?!\S) takes the run minus its last
  // character (it must be followed by whitespace), then \s+ takes the '\n' alone. Encoded
  // apart, the first piece's run ends the text, so \s+(?!\S) takes all of it (the same chunk),
  // and the second piece starts with the same lone '\n'. No chunk reaches across the cut otherwise.
  auto visible = [](char c) { return c > ' ' && c < 0x7F; };
  return cut > 0 && cut + 1 < text.size() && text[cut] == '\n' && visible(text[cut + 1]);
}

}  // namespace pf
