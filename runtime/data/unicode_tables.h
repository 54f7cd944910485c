// The generated category tables behind unicode.h (defined in unicode_tables.cc).
#pragma once

#include <cstddef>

namespace fsdp::data {

// A closed range [first, last] of Unicode code points.
struct CodePointRange {
  char32_t first;
  char32_t last;
};

// Letters (general category L*) and numbers (N*), sorted, non-overlapping.
extern const CodePointRange kLetterRanges[];
extern const std::size_t kLetterCount;
extern const CodePointRange kNumberRanges[];
extern const std::size_t kNumberCount;

}  // namespace fsdp::data
