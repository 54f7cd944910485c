// A limit on how deeply JSON input may nest, checked by one linear scan of the text before
// it is parsed: recipes, metadata.json, Hugging Face config.json and the other JSON files
// the tools read are a few levels deep, and a file nested thousands of levels deep is
// refused at once instead of costing parse time (or stack) in proportion to its depth.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/core/error.h"

namespace fsdp {

inline constexpr int kMaxJsonDepth = 128;

// Where in a text a character is: 1-based line and column (in bytes).
struct TextPosition {
  size_t line = 1;
  size_t column = 1;
};

// The position of the first '[' or '{' of `text` that opens a level deeper than max_depth
// (brackets inside strings do not count), or nullopt when the text never nests that deep.
// Only the nesting is looked at: the text need not be valid JSON.
std::optional<TextPosition> json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth);

// Throws ErrorType "SOURCE:LINE:COLUMN: JSON nested deeper than 128 levels" when `text`
// nests deeper than kMaxJsonDepth.
template <typename ErrorType>
void check_json_depth(std::string_view text, const std::string& source) {
  if (const std::optional<TextPosition> at = json_too_deep(text))
    FSDP_THROW(ErrorType, source, ":", at->line, ":", at->column, ": JSON nested deeper than ",
               kMaxJsonDepth, " levels");
}

}  // namespace fsdp
