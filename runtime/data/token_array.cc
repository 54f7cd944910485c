#include "runtime/data/token_array.h"

#include "runtime/core/error.h"
#include "runtime/data/files.h"

namespace fsdp::data {
namespace {

// Calls f(T{}) with the C++ type stored for `type`.
template <typename F>
void with_type(TokenType type, F&& f) {
  switch (type) {
    case TokenType::u8: return f(uint8_t{});
    case TokenType::i8: return f(int8_t{});
    case TokenType::i16: return f(int16_t{});
    case TokenType::u16: return f(uint16_t{});
    case TokenType::i32: return f(int32_t{});
    case TokenType::u32: return f(uint32_t{});
    case TokenType::i64: return f(int64_t{});
  }
  FSDP_ASSERT(false, "unknown TokenType ", static_cast<int>(type));
}

}  // namespace

int token_type_size(TokenType type) {
  int size = 0;
  with_type(type, [&](auto t) { size = sizeof(t); });
  return size;
}

const char* token_type_name(TokenType type) {
  switch (type) {
    case TokenType::u8: return "uint8";
    case TokenType::i8: return "int8";
    case TokenType::i16: return "int16";
    case TokenType::u16: return "uint16";
    case TokenType::i32: return "int32";
    case TokenType::u32: return "uint32";
    case TokenType::i64: return "int64";
  }
  return "unknown";
}

int64_t TokenArray::at(uint64_t i) const {
  FSDP_ASSERT(i < count, "token ", i, " of ", count);
  int64_t value = 0;
  with_type(type, [&](auto t) {
    using T = decltype(t);
    value = static_cast<int64_t>(load_le<T>(bytes + i * sizeof(T)));
  });
  return value;
}

void TokenArray::copy_to(uint64_t first, uint64_t n, int32_t* out) const {
  FSDP_ASSERT(first + n <= count, "tokens [", first, ", ", first + n, ") of ", count);
  with_type(type, [&](auto t) {
    using T = decltype(t);
    const unsigned char* p = bytes + first * sizeof(T);
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load_le<T>(p + i * sizeof(T)));
  });
}

void TokenArray::check_vocab(int64_t vocab_size) const {
  FSDP_CHECK(vocab_size > 0, ValueError, "vocabulary size must be positive, got ", vocab_size);
  with_type(type, [&](auto t) {
    using T = decltype(t);
    for (uint64_t i = 0; i < count; ++i) {
      const int64_t token = static_cast<int64_t>(load_le<T>(bytes + i * sizeof(T)));
      FSDP_CHECK(token >= 0 && token < vocab_size, DataError, "'", file, "' byte offset ",
                 byte_offset(i), ": token ", token, " (token #", i,
                 ") is outside the model's vocabulary [0, ", vocab_size, ")");
    }
  });
}

TokenArray tokens_in_memory(std::vector<int32_t> tokens, const std::string& name) {
  auto storage = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  TokenArray array;
  array.bytes = reinterpret_cast<const unsigned char*>(storage->data());
  array.count = storage->size();
  array.type = TokenType::i32;
  array.file = name;
  array.owner = std::move(storage);
  return array;
}

}  // namespace fsdp::data
