// The JSON nesting limit: one linear scan finds the first bracket past it, strings aside.
#include "runtime/core/json_depth.h"

#include <string>

#include "tests/test_support.h"

using fsdp::json_too_deep;

TEST_CASE("json_too_deep finds the first bracket past the limit", "[core]") {
  CHECK_FALSE(json_too_deep(R"({"a": [1, {"b": []}]})", 4));
  const auto at = json_too_deep(R"({"a": [1, {"b": []}]})", 2);
  REQUIRE(at);
  CHECK(at->line == 1);
  CHECK(at->column == 11);  // the '{' of {"b": ...}
  // Siblings do not add up; closing brackets count down.
  CHECK_FALSE(json_too_deep("[[1], [2], [[3]]]", 3));
  // Brackets inside strings, escaped quotes included, are text.
  CHECK_FALSE(json_too_deep(R"(["[[[[", "\"[[[[", "\\"])", 1));
  CHECK(json_too_deep(R"(["\\", [[]]])", 2));
  // Lines and columns count from 1.
  const auto second = json_too_deep("{\n  \"x\": [[\n", 2);
  REQUIRE(second);
  CHECK(second->line == 2);
  CHECK(second->column == 9);
}

TEST_CASE("check_json_depth throws the caller's error type naming source and position",
          "[core]") {
  CHECK_NOTHROW(fsdp::check_json_depth<fsdp::ConfigError>(std::string(128, '['), "a.json"));
  const std::string deep(1000, '[');
  CHECK_THROWS_AS(fsdp::check_json_depth<fsdp::ConfigError>(deep, "a.json"), fsdp::ConfigError);
  CHECK_THROWS_AS(fsdp::check_json_depth<fsdp::DataError>(deep, "a.json"), fsdp::DataError);
  CHECK_THROWS_WITH(fsdp::check_json_depth<fsdp::ConfigError>(deep, "a.json"),
                    "a.json:1:129: JSON nested deeper than 128 levels");
}
