// A read-only run of tokens as a data file stores them (uint16 or uint32 in llm.c shards, any
// integer width in Megatron .bin files), with the file name and byte offset that error
// messages need.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

// How tokens are stored on disk (little-endian).
enum class TokenType : uint8_t { u8, i8, i16, u16, i32, u32, i64 };

int token_type_size(TokenType type);  // bytes per token
const char* token_type_name(TokenType type);

struct TokenArray {
  std::shared_ptr<const void> owner;  // keeps `bytes` alive (a MappedFile, a vector, ...)
  const unsigned char* bytes = nullptr;
  uint64_t count = 0;
  TokenType type = TokenType::u16;
  std::string file;          // where the tokens live, for messages
  uint64_t file_offset = 0;  // byte offset of token 0 in `file`

  int64_t at(uint64_t i) const;
  // Tokens [first, first + n) into out, as int32. Values are not range-checked here: run
  // check_vocab() once up front.
  void copy_to(uint64_t first, uint64_t n, int32_t* out) const;
  // DataError naming the file and the byte offset of the first token outside [0, vocab_size).
  void check_vocab(int64_t vocab_size) const;
  uint64_t byte_offset(uint64_t i) const { return file_offset + i * token_type_size(type); }
};

// Tokens held in memory (e.g. freshly tokenized text); `name` stands in for a file name.
TokenArray tokens_in_memory(std::vector<int32_t> tokens, const std::string& name);

}  // namespace fsdp::data
