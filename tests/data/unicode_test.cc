#include "runtime/data/unicode.h"

#include <string>

#include "tests/test_support.h"

using fsdp::data::append_utf8;
using fsdp::data::decode_utf8;
using fsdp::data::is_letter;
using fsdp::data::is_number;
using fsdp::data::is_whitespace;

TEST_CASE("decode_utf8 reads 1- to 4-byte characters", "[data][unicode]") {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x99\x82";  // a é € 🙂
  auto c = decode_utf8(text, 0);
  CHECK((c.code_point == U'a' && c.length == 1 && c.valid));
  c = decode_utf8(text, 1);
  CHECK((c.code_point == 0xE9 && c.length == 2 && c.valid));
  c = decode_utf8(text, 3);
  CHECK((c.code_point == 0x20AC && c.length == 3 && c.valid));
  c = decode_utf8(text, 6);
  CHECK((c.code_point == 0x1F642 && c.length == 4 && c.valid));
}

TEST_CASE("decode_utf8 takes invalid bytes one at a time", "[data][unicode]") {
  // A lone continuation byte, an overlong '/', a truncated 3-byte sequence, a surrogate.
  for (const std::string bad : {"\x80", "\xC0\xAF", "\xE2\x82", "\xED\xA0\x80", "\xFF"}) {
    const auto c = decode_utf8(bad, 0);
    CHECK_FALSE(c.valid);
    CHECK(c.length == 1);
  }
}

TEST_CASE("append_utf8 inverts decode_utf8", "[data][unicode]") {
  for (const char32_t cp : {U'A', char32_t(0xE9), char32_t(0x7FF), char32_t(0x800),
                            char32_t(0xFFFD), char32_t(0x10000), char32_t(0x10FFFF)}) {
    std::string s;
    append_utf8(cp, s);
    const auto c = decode_utf8(s, 0);
    CHECK(c.valid);
    CHECK(c.code_point == cp);
    CHECK(static_cast<std::size_t>(c.length) == s.size());
  }
}

TEST_CASE("letters follow Unicode's L categories", "[data][unicode]") {
  for (char32_t c = 'a'; c <= 'z'; ++c) CHECK(is_letter(c));
  for (char32_t c = 'A'; c <= 'Z'; ++c) CHECK(is_letter(c));
  // Latin-1: ª µ º À..Ö Ø..ö ø..ÿ are letters; × and ÷ are math symbols.
  for (const char32_t c : {0xAA, 0xB5, 0xBA, 0xC0, 0xD6, 0xD8, 0xE9, 0xF6, 0xF8, 0xFF}) {
    CHECK(is_letter(c));
  }
  CHECK_FALSE(is_letter(0xD7));
  CHECK_FALSE(is_letter(0xF7));
  // Latin Extended-A/B, Greek, Cyrillic, CJK, Hiragana, Hangul.
  for (const char32_t c : {0x100, 0x17F, 0x180, 0x24F, 0x3B1, 0x416, 0x4E2D, 0x3042, 0xAC00}) {
    CHECK(is_letter(c));
  }
  // Not letters: digits, punctuation, a combining accent, an emoji, the Greek question mark.
  for (const char32_t c : {U'0', U'\'', U'_', char32_t(0x301), char32_t(0x1F642),
                           char32_t(0x37E), char32_t(0x2014)}) {
    CHECK_FALSE(is_letter(c));
  }
}

TEST_CASE("numbers follow Unicode's N categories", "[data][unicode]") {
  for (char32_t c = '0'; c <= '9'; ++c) CHECK(is_number(c));
  // ² ³ ¹ ¼ ½ ¾, Arabic-Indic 5, Roman numeral one, circled 1, fullwidth 7.
  for (const char32_t c : {0xB2, 0xB3, 0xB9, 0xBC, 0xBD, 0xBE, 0x665, 0x2160, 0x2460, 0xFF17}) {
    CHECK(is_number(c));
  }
  for (const char32_t c : {U'a', U'.', U',', char32_t(0xE9)}) CHECK_FALSE(is_number(c));
}

TEST_CASE("whitespace is Unicode White_Space", "[data][unicode]") {
  for (const char32_t c : {0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x2003, 0x3000}) {
    CHECK(is_whitespace(c));
  }
  for (const char32_t c : {U'a', U'0', char32_t(0x200B), char32_t(0x1F)}) {
    CHECK_FALSE(is_whitespace(c));
  }
}
