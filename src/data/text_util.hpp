#pragma once
// Small UTF-8 and file helpers shared by the tokenizers.
#include <cstdint>
#include <string>
#include <string_view>

#include <utf8proc.h>

namespace pf {

inline void append_utf8(std::string& s, int32_t c) {
  if (c < 0x80) {
    s.push_back(static_cast<char>(c));
    return;
  }
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(c, buf);
  s.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Calls f(code point) for each character of a UTF-8 string; an invalid byte is reported as
// U+FFFD and skipped (the tokenizers then treat it as Python would treat a replacement char).
template <typename F>
void for_each_code_point(std::string_view s, F&& f) {
  auto p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size());
  for (utf8proc_ssize_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      f(static_cast<int32_t>(p[i++]));
      continue;
    }
    int32_t c;
    auto len = utf8proc_iterate(p + i, n - i, &c);
    if (len < 0) {
      f(0xFFFD);
      ++i;
    } else {
      f(c);
      i += len;
    }
  }
}

// The offset of the first byte that does not start a valid UTF-8 character (overlong forms,
// surrogates and code points past U+10FFFF included), or npos when s is valid UTF-8.
inline size_t first_invalid_utf8(std::string_view s) {
  auto p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size());
  for (utf8proc_ssize_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int32_t c;
    const auto len = utf8proc_iterate(p + i, n - i, &c);
    if (len < 0) return static_cast<size_t>(i);
    i += len;
  }
  return std::string_view::npos;
}

// Both tokenizers take UTF-8 text only: UsageError("<what>: invalid UTF-8 near byte N") otherwise.
void require_utf8(std::string_view text, const std::string& what);

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t p = 0;
  for (size_t q; (q = s.find(from, p)) != std::string::npos; p = q + from.size()) {
    out.append(s, p, q - p);
    out.append(to);
  }
  if (p == 0) return;
  out.append(s, p);
  s.swap(out);
}

// Reads a whole file; UsageError("<path>: cannot read <what> ...") if it cannot.
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace pf
