// Plain-text input: files read as documents and turned into token streams.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace fsdp::data {

// The documents in `files`, in order: one per file, or with split_on_blank_lines one per
// paragraph group (text between runs of blank lines; lines of only spaces, tabs or '\r' count
// as blank). Empty documents are dropped. DataError naming a file that cannot be read.
std::vector<std::string> read_text_documents(const std::vector<std::string>& files,
                                             bool split_on_blank_lines);

// The same rule for text already in memory (a decompressed file, a JSON string): appends
// `text` as one document (unless empty), or its paragraph groups, to `docs`.
void append_text_documents(std::string text, bool split_on_blank_lines,
                           std::vector<std::string>& docs);

// One token stream: each document's tokens preceded by the end-of-text token, as GPT-2 and
// llm.c lay out their training data. Text is encoded as ordinary text (a literal
// "<|endoftext|>" in a document is not special).
std::vector<int32_t> tokenize_documents(Gpt2Tokenizer& tokenizer,
                                        const std::vector<std::string>& documents);

}  // namespace fsdp::data
