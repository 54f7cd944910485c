// The recipe parser: JSON text, then overrides ("key=value"), all through the schema and the
// recipe's checks. Input: the JSON, then each override after a NUL byte.
// Property: a recipe that loads writes a resolved JSON that loads back to the same recipe.
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  std::vector<std::string> parts = fuzz::split_at_nul(fuzz::bytes_of(data, size));
  const std::string json = parts[0];
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  train::Recipe recipe;
  try {
    recipe = train::parse_recipe(json, overrides, "fuzz.json");
  } catch (const Error&) {
    return 0;  // refused with a message
  }
  train::Recipe again;
  try {
    again = train::parse_recipe(recipe.to_json_string(), {}, "resolved.json");
  } catch (const Error&) {
    fuzz::property_failed("a loaded recipe's resolved JSON does not load");
  }
  if (!train::first_difference(recipe, again).empty())
    fuzz::property_failed("a loaded recipe's resolved JSON loads to a different recipe");
  return 0;
}
