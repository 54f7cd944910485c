// The documents of tokenize's input files: plain text or JSON lines, either of them
// gzip-compressed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fsdp::tokenize {

// Documents as lists of sentences, kept flat for the encoder: document d is sentences
// [first_sentence[d], first_sentence[d + 1]). A plain-text document or a JSON string is one
// sentence; a JSON list of strings (Megatron's pre-split sentences) is one per element. A
// document's sentences may be empty, or it may have none: Megatron keeps such a document.
struct Documents {
  std::vector<std::string> sentences;
  std::vector<size_t> first_sentence = {0};

  size_t size() const { return first_sentence.size() - 1; }
  size_t sentence_count(size_t d) const { return first_sentence[d + 1] - first_sentence[d]; }
  void add(std::string text);                   // a document of one sentence
  void add(std::vector<std::string> sentences);  // a document of these sentences
  void append(Documents&& other);               // other's documents after these
};

struct InputFormat {
  // Empty: plain text. Otherwise every non-blank line is a JSON object whose member
  // `json_key` is one document (as Megatron-LM's preprocess_data.py --json-keys).
  std::string json_key;
  // Plain text: a blank line ends a document (runtime/data/text_documents.h).
  bool split_blank_lines = false;
};

// The file's bytes; a gzip file (recognized by its magic bytes, whatever its name; several
// concatenated gzip members are read one after the other) is decompressed. DataError naming
// the file when it cannot be opened, read or decompressed (a truncated .gz included).
std::string read_input_bytes(const std::string& path);

// The documents of JSON-lines `bytes` read from `path` (named in errors), as Megatron's
// preprocess_data.py reads them: member `key` of each line's object is a string (one
// sentence, possibly empty: an empty document is kept) or a list of strings (pre-split
// sentences). DataError naming the file, line and byte offset of a line that is not a JSON
// object, lacks the key, or whose member is neither (naming the list element).
Documents json_lines_documents(const std::string& bytes, const std::string& key,
                               const std::string& path);

// One file's documents in file order. Plain text drops empty documents
// (runtime/data/text_documents.h); JSON lines keep them.
Documents read_input_documents(const std::string& path, const InputFormat& format);

// Every file's documents, files in the order given, read (and decompressed, and parsed) on
// `workers` threads.
Documents read_all_documents(const std::vector<std::string>& paths, const InputFormat& format,
                             unsigned workers);

}  // namespace fsdp::tokenize
