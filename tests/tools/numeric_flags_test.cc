// The tools' numeric flags: the whole text is the number, finite, within the stated bounds;
// anything else is a ConfigError naming the flag.
#include "tools/common/numeric_flags.h"

#include <cstdint>
#include <limits>

#include "tests/test_support.h"

using fsdp::ConfigError;
using fsdp::tools::integer_flag;
using fsdp::tools::number_flag;

TEST_CASE("an integer flag is whole decimal digits within its bounds", "[tools]") {
  CHECK(integer_flag<int64_t>("--n", "64", 0, 100) == 64);
  CHECK(integer_flag<int64_t>("--n", "-3", -5, 5) == -3);
  CHECK(integer_flag<uint64_t>("--seed", "18446744073709551615", 0,
                               std::numeric_limits<uint64_t>::max()) ==
        std::numeric_limits<uint64_t>::max());
  for (const char* bad : {"", "64abc", "1e12", "6.4", " 64", "+64", "101", "-1", "0x40",
                          "99999999999999999999"}) {
    INFO(bad);
    CHECK_THROWS_AS(integer_flag<int64_t>("--n", bad, 0, 100), ConfigError);
    CHECK_THROWS_WITH(integer_flag<int64_t>("--n", bad, 0, 100),
                      "--n must be a whole number from 0 to 100, got '" + std::string(bad) + "'");
  }
  CHECK_THROWS_AS(integer_flag<uint64_t>("--seed", "-1", 0, 10), ConfigError);
}

TEST_CASE("a number flag is finite and within its bounds", "[tools]") {
  CHECK(number_flag("--t", "0.8", 0) == 0.8);
  CHECK(number_flag("--t", "1e-3", 0) == 1e-3);
  CHECK(number_flag("--p", "1", 0, 1) == 1.0);
  for (const char* bad : {"", "inf", "nan", "-1", "0.8x", "1e999"}) {
    INFO(bad);
    CHECK_THROWS_WITH(number_flag("--t", bad, 0),
                      "--t must be a finite number >= 0, got '" + std::string(bad) + "'");
  }
  CHECK_THROWS_WITH(number_flag("--p", "1.5", 0, 1), "--p must be a number from 0 to 1, got '1.5'");
}
