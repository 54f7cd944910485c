// Numeric command-line flags of the tools, read strictly: the whole text must be the number
// ("64", not "64abc"; an integer flag takes no exponent: "1e12" is refused), a number must
// be finite, and both must lie within the bounds the flag states. Anything else is a
// ConfigError naming the flag, what it takes and the text given.
#pragma once

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>

#include "runtime/core/error.h"

namespace fsdp::tools {

// A whole number in [lo, hi], written in decimal digits (with a leading '-' when negative).
template <typename Int>
Int integer_flag(const std::string& flag, const std::string& text, Int lo, Int hi) {
  Int value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  FSDP_CHECK(!text.empty() && error == std::errc() && stop == end && value >= lo && value <= hi,
             ConfigError, flag, " must be a whole number from ", lo, " to ", hi, ", got '", text,
             "'");
  return value;
}

// A finite number (0.8, 1e-3) in [lo, hi]; without hi, any finite number >= lo.
inline double number_flag(const std::string& flag, const std::string& text, double lo,
                          double hi = std::numeric_limits<double>::infinity()) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  const bool ok = !text.empty() && error == std::errc() && stop == end && std::isfinite(value) &&
                  value >= lo && value <= hi;
  if (std::isinf(hi))
    FSDP_CHECK(ok, ConfigError, flag, " must be a finite number >= ", lo, ", got '", text, "'");
  FSDP_CHECK(ok, ConfigError, flag, " must be a number from ", lo, " to ", hi, ", got '", text,
             "'");
  return value;
}

}  // namespace fsdp::tools
