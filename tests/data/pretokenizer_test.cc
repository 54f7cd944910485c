#include "runtime/data/pretokenizer.h"

#include <string>
#include <vector>

#include "tests/test_support.h"

namespace {

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  for (const auto w : fsdp::data::split_gpt2_words(text)) out.emplace_back(w);
  return out;
}

using Words = std::vector<std::string>;

}  // namespace

// Expected splits are those of the reference pattern under a Unicode-aware regex engine.
TEST_CASE("GPT-2 pre-tokenization splits like the reference pattern", "[data][tokenizer]") {
  CHECK(words("Hello world") == Words{"Hello", " world"});
  CHECK(words("I'm sure it's fine, they'll say; we've, you're, she'd, can't.") ==
        Words{"I", "'m", " sure", " it", "'s", " fine", ",", " they", "'ll", " say", ";", " we",
              "'ve", ",", " you", "'re", ",", " she", "'d", ",", " can", "'t", "."});
  CHECK(words("Numbers: 1234567 and 3.14159, \xC2\xBD and x\xC2\xB2!") ==
        Words{"Numbers", ":", " 1234567", " and", " 3", ".", "14159", ",", " \xC2\xBD", " and",
              " x", "\xC2\xB2", "!"});
  CHECK(words("multiple   spaces   here") ==
        Words{"multiple", "  ", " spaces", "  ", " here"});
  CHECK(words("line1\nline2\n\nline3\n") ==
        Words{"line", "1", "\n", "line", "2", "\n", "\n", "line", "3", "\n"});
  CHECK(words("tabs\tand\r\nCRLF") == Words{"tabs", "\t", "and", "\r", "\n", "CRLF"});
  CHECK(words("  leading and trailing  ") ==
        Words{" ", " leading", " and", " trailing", "  "});
  CHECK(words("'S 'LL ''s x'''s") ==
        Words{"'", "S", " '", "LL", " ''", "s", " x", "'''", "s"});
  CHECK(words("a \n\n b") == Words{"a", " \n\n", " b"});
  CHECK(words("wait...   what?!") == Words{"wait", "...", "  ", " what", "?!"});
  // A no-break space and an ideographic space are whitespace, but only U+0020 joins a word.
  CHECK(words("\xC2\xA0nbsp\xE3\x80\x80ideographic") ==
        Words{"\xC2\xA0", "nbsp", "\xE3\x80\x80", "ideographic"});
  // Letters of any script stay together; a combining accent is not a letter.
  CHECK(words("caf\xC3\xA9 na\xC3\xAFve") == Words{"caf\xC3\xA9", " na\xC3\xAFve"});
  CHECK(words("e\xCC\x81 combining") == Words{"e", "\xCC\x81", " combining"});
  CHECK(words("emoji \xF0\x9F\x99\x82\xF0\x9F\x91\x8D done") ==
        Words{"emoji", " \xF0\x9F\x99\x82\xF0\x9F\x91\x8D", " done"});
}

TEST_CASE("pre-tokenization keeps every byte, valid UTF-8 or not", "[data][tokenizer]") {
  CHECK(words("").empty());
  CHECK(words(" ") == Words{" "});
  CHECK(words("\n\n") == Words{"\n\n"});
  // Invalid bytes are "other" characters: they group with punctuation.
  CHECK(words("ab\xFF\xFE!cd") == Words{"ab", "\xFF\xFE!", "cd"});
  const std::string messy = "x \xC3(\x80 \xE2\x82 y\xF0\x9F";
  std::string joined;
  for (const auto& w : words(messy)) joined += w;
  CHECK(joined == messy);
}
