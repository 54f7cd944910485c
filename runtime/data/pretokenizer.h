// GPT-2's pre-tokenization: the text is cut into "words" before byte-pair encoding, exactly as
// the regular expression
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// would cut it (leftmost alternative wins, each one greedy). std::regex knows neither \p{..}
// nor UTF-8, so the alternatives are walked by hand over code points (unicode.h).
#pragma once

#include <string_view>
#include <vector>

namespace fsdp::data {

// The words of `text`, in order, as views into it; concatenated they give back `text`
// byte for byte, including bytes that are not valid UTF-8 (each such byte is treated as a
// character that is neither a letter, a number nor whitespace).
std::vector<std::string_view> split_gpt2_words(std::string_view text);

}  // namespace fsdp::data
