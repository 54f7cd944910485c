// tokenize's JSON-lines input (--json-key text): one JSON object per line, its "text" a string
// or a list of strings (Megatron's pre-split sentences).
// Properties: an accepted file has one document per non-blank line, and the documents' first
// sentences rise from 0 to the sentence count.
#include <string>
#include <string_view>

#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_target.h"
#include "tools/tokenize/input_documents.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  const std::string bytes(fuzz::bytes_of(data, size));
  try {
    const tokenize::Documents docs = tokenize::json_lines_documents(bytes, "text", "input.jsonl");
    size_t lines = 0;
    for (size_t begin = 0; begin < bytes.size();) {
      size_t end = bytes.find('\n', begin);
      if (end == std::string::npos) end = bytes.size();
      const std::string_view line(bytes.data() + begin, end - begin);
      if (line.find_first_not_of(" \t\r") != std::string_view::npos) ++lines;
      begin = end + 1;
    }
    if (docs.size() != lines) fuzz::property_failed("not one document per non-blank line");
    if (docs.first_sentence.front() != 0 || docs.first_sentence.back() != docs.sentences.size())
      fuzz::property_failed("the documents do not cover the sentences");
    for (size_t d = 0; d < docs.size(); ++d)
      if (docs.first_sentence[d + 1] < docs.first_sentence[d])
        fuzz::property_failed("a document's sentences go back");
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
