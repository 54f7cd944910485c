// The documents of tokenize's input files: plain text or JSON lines, either of them
// gzip-compressed.
#pragma once

#include <string>
#include <vector>

namespace fsdp::tokenize {

struct InputFormat {
  // Empty: plain text. Otherwise every non-blank line is a JSON object whose string member
  // `json_key` is one document (as Megatron-LM's preprocess_data.py --json-keys).
  std::string json_key;
  // Plain text: a blank line ends a document (runtime/data/text_documents.h).
  bool split_blank_lines = false;
};

// The file's bytes; a gzip file (recognized by its magic bytes, whatever its name; several
// concatenated gzip members are read one after the other) is decompressed. DataError naming
// the file when it cannot be opened, read or decompressed (a truncated .gz included).
std::string read_input_bytes(const std::string& path);

// The documents of JSON-lines `bytes` read from `path` (named in errors): DataError naming
// the file, line and byte offset of a line that is not a JSON object, lacks the key, or
// whose member is not a string. Empty strings are dropped, as empty text files are.
std::vector<std::string> json_lines_documents(const std::string& bytes, const std::string& key,
                                              const std::string& path);

// One file's documents in file order.
std::vector<std::string> read_input_documents(const std::string& path, const InputFormat& format);

// Every file's documents, files in the order given, read (and decompressed, and parsed) on
// `workers` threads.
std::vector<std::string> read_all_documents(const std::vector<std::string>& paths,
                                            const InputFormat& format, unsigned workers);

}  // namespace fsdp::tokenize
