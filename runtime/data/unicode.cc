#include "runtime/data/unicode.h"

#include <algorithm>
#include <string>

#include "runtime/data/unicode_tables.h"

namespace fsdp::data {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

bool in_ranges(char32_t c, const CodePointRange* ranges, std::size_t count) {
  // The first range whose last >= c is the only one that can hold c.
  const CodePointRange* end = ranges + count;
  const CodePointRange* it = std::lower_bound(
      ranges, end, c, [](const CodePointRange& r, char32_t value) { return r.last < value; });
  return it != end && it->first <= c;
}

}  // namespace

Utf8Char decode_utf8(std::string_view text, std::size_t pos) {
  const unsigned char b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return {b0, 1, true};
  const Utf8Char invalid{kReplacement, 1, false};

  int length;
  char32_t cp;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4;
    cp = b0 & 0x07;
  } else {
    return invalid;  // a continuation byte or 0xF8..0xFF where a character should start
  }
  if (pos + length > text.size()) return invalid;
  for (int i = 1; i < length; ++i) {
    const unsigned char b = static_cast<unsigned char>(text[pos + i]);
    if (!is_continuation(b)) return invalid;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not characters.
  static constexpr char32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return invalid;
  }
  return {cp, length, true};
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return in_ranges(c, kLetterRanges, kLetterCount);
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return in_ranges(c, kNumberRanges, kNumberCount);
}

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20:
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace fsdp::data
