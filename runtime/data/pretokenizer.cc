#include "runtime/data/pretokenizer.h"

#include "runtime/data/unicode.h"

namespace fsdp::data {
namespace {

enum class CharClass { Letter, Number, Space, Other };

CharClass classify(const Utf8Char& ch) {
  if (!ch.valid) return CharClass::Other;
  if (is_letter(ch.code_point)) return CharClass::Letter;
  if (is_number(ch.code_point)) return CharClass::Number;
  if (is_whitespace(ch.code_point)) return CharClass::Space;
  return CharClass::Other;
}

// Length in bytes of the contraction ('s 't 're 've 'm 'll 'd) starting at pos, or 0.
// Only the ASCII apostrophe and lower-case suffixes count, as in the pattern.
std::size_t contraction_length(std::string_view text, std::size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of characters of class `cls` that starts at pos.
std::size_t run_end(std::string_view text, std::size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const Utf8Char ch = decode_utf8(text, pos);
    if (classify(ch) != cls) break;
    pos += ch.length;
  }
  return pos;
}

// Length of the word that starts at pos (pos < text.size()).
std::size_t word_length(std::string_view text, std::size_t pos) {
  // 's|'t|'re|'ve|'m|'ll|'d
  if (const std::size_t n = contraction_length(text, pos)) return n;

  const Utf8Char first = decode_utf8(text, pos);
  const CharClass first_class = classify(first);

  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional single U+0020 space, then a
  // run of one class. The space only joins a run that follows it directly.
  std::size_t body = pos;
  CharClass body_class = first_class;
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const CharClass next = classify(decode_utf8(text, pos + 1));
    if (next != CharClass::Space) {
      body = pos + 1;
      body_class = next;
    }
  }
  if (body_class != CharClass::Space) return run_end(text, body, body_class) - pos;

  // "\s+(?!\S)": the whitespace run, less its last character when a non-space follows, so
  // that character can lead the next word (" word"). "\s+": a lone space before a non-space.
  const std::size_t end = run_end(text, pos, CharClass::Space);
  if (end == text.size()) return end - pos;
  std::size_t last = pos;  // start of the run's last character
  for (std::size_t p = pos; p < end; p += decode_utf8(text, p).length) last = p;
  return last > pos ? last - pos : end - pos;
}

}  // namespace

std::vector<std::string_view> split_gpt2_words(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t n = word_length(text, pos);
    words.push_back(text.substr(pos, n));
    pos += n;
  }
  return words;
}

}  // namespace fsdp::data
