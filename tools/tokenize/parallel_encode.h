// Encoding many documents on all cores with the ids one core would give.
//
// Work is cut into pieces of about a megabyte: whole small documents, or parts of a large
// one cut where GPT-2's pre-tokenizer always cuts (split_for_encoding), so the encoding of
// a document is the concatenation of its pieces' encodings whatever the cut. Each worker
// encodes with its own copy of the tokenizer (encoding caches words, so one tokenizer is not
// thread-safe) and the pieces are put back in document order: the ids, and so the files
// written from them, do not depend on the number of workers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace fsdp::tokenize {

// `text` cut into consecutive pieces of at least `target_bytes` (the last may be shorter),
// each cut just before a '\n' that follows a printable ASCII character other than a space.
// GPT-2's pattern never matches across such a point: no alternative matches a non-space
// followed by whitespace, so a word ends there and the whitespace run starts a new one.
std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes);

struct EncodeOptions {
  unsigned workers = 1;           // threads, the calling one included
  size_t piece_bytes = 1 << 20;   // see split_for_encoding
  bool progress = true;           // a progress line on stderr for jobs longer than 2 s
};

// Each document's ids (encoded as ordinary text, no end-of-text token added), in order.
std::vector<std::vector<int32_t>> encode_documents(const data::Gpt2Tokenizer& tokenizer,
                                                   const std::vector<std::string>& documents,
                                                   const EncodeOptions& options);

}  // namespace fsdp::tokenize
