// UTF-8 decoding and the three Unicode character classes GPT-2's pre-tokenizer uses.
//
// Letters (\p{L}) and numbers (\p{N}) come from full tables of the Unicode general categories
// (unicode_tables.cc), so they are exact for every script of that Unicode version. Whitespace
// (\s) is Unicode's White_Space property. The only known differences from reference
// implementations are in \s: JavaScript's \s also matches U+FEFF, and Python's `re` also
// matches U+001C..U+001F; neither does here.
#pragma once

#include <cstddef>
#include <string_view>

namespace fsdp::data {

// One step of UTF-8 decoding. `length` is the number of bytes consumed (1..4). Bytes that do
// not start a valid, shortest-form sequence of a scalar value decode one byte at a time as
// `valid = false` with code_point U+FFFD, so every byte string can be walked and no byte lost.
struct Utf8Char {
  char32_t code_point;
  int length;
  bool valid;
};

// Decodes the character starting at text[pos]; pos < text.size().
Utf8Char decode_utf8(std::string_view text, std::size_t pos);

// Appends the UTF-8 encoding of a scalar value (not a surrogate, <= U+10FFFF) to out.
void append_utf8(char32_t code_point, std::string& out);

bool is_letter(char32_t c);      // \p{L}
bool is_number(char32_t c);      // \p{N}
bool is_whitespace(char32_t c);  // \s

}  // namespace fsdp::data
