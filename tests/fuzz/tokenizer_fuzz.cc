// The GPT-2 tokenizer: arbitrary bytes in, ids out.
// Properties: every id is inside the vocabulary, and decode(encode(x)) == x for any bytes
// (valid UTF-8 or not), with and without "<|endoftext|>" read as the special token.
#include <string>
#include <vector>

#include "runtime/data/assets.h"
#include "runtime/data/tokenizer.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  // Loaded once per process (run from the repository root, or from a test's runfiles).
  static data::Gpt2Tokenizer tokenizer(data::locate_asset(data::kGpt2VocabAsset),
                                       data::locate_asset(data::kGpt2MergesAsset));
  const std::string text(fuzz::bytes_of(data, size));
  for (bool allow_special : {false, true}) {
    const std::vector<int32_t> ids = tokenizer.encode(text, allow_special);
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) fuzz::property_failed("an id outside the vocabulary");
    if (tokenizer.decode(ids) != text) fuzz::property_failed("decode(encode(x)) != x");
  }
  return 0;
}
