#include "runtime/data/llmc_shards.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/files.h"

namespace fsdp::data {
namespace {

struct Header {
  int32_t magic, version;
  TokenType type;
};

Header header_of(LlmcShardFormat format) {
  switch (format) {
    case LlmcShardFormat::gpt2: return {kLlmcGpt2Magic, 1, TokenType::u16};
    case LlmcShardFormat::llama3: return {kLlmcLlama3Magic, 7, TokenType::u32};
    case LlmcShardFormat::fsdp_uint32: return {kLlmcGpt2Magic, 2, TokenType::u32};
  }
  FSDP_THROW(InternalError, "unknown LlmcShardFormat ", static_cast<int>(format));
}

constexpr const char* kKinds =
    "magic 20240520 version 1 (llm.c GPT-2, uint16), magic 20240801 version 7 (llm.c Llama 3, "
    "uint32), or magic 20240520 version 2 (fsdp.cpp's own uint32 shards)";

}  // namespace

const char* llmc_format_name(LlmcShardFormat format) {
  switch (format) {
    case LlmcShardFormat::gpt2: return "llm.c GPT-2 (uint16)";
    case LlmcShardFormat::llama3: return "llm.c Llama 3 (uint32)";
    case LlmcShardFormat::fsdp_uint32: return "fsdp.cpp's own version 2 (uint32)";
  }
  return "unknown";
}

TokenArray open_llmc_shard(const std::string& path, LlmcShardFormat* format) {
  auto file = std::make_shared<const MappedFile>(path);
  const uint64_t size = file->size();
  FSDP_CHECK(size >= kLlmcHeaderBytes, DataError, "'", path,
             "': truncated llm.c shard at byte offset ", size, ": the header needs ",
             kLlmcHeaderBytes, " bytes");
  int32_t header[kLlmcHeaderInts];
  std::memcpy(header, file->data(), kLlmcHeaderBytes);

  const int32_t magic = header[0], version = header[1];
  FSDP_CHECK(magic == kLlmcGpt2Magic || magic == kLlmcLlama3Magic, DataError, "'", path,
             "' byte offset 0: bad magic ", magic, " (not an llm.c token shard; expected ",
             kKinds, ")");
  LlmcShardFormat kind = LlmcShardFormat::gpt2;
  if (magic == kLlmcLlama3Magic && version == 7) {
    kind = LlmcShardFormat::llama3;
  } else if (magic == kLlmcGpt2Magic && version == 2) {
    kind = LlmcShardFormat::fsdp_uint32;
  } else {
    FSDP_CHECK(magic == kLlmcGpt2Magic && version == 1, DataError, "'", path,
               "' byte offset 4: unsupported version ", version, " for magic ", magic,
               " (expected ", kKinds, ")");
  }
  const int32_t num_tokens = header[2];
  FSDP_CHECK(num_tokens >= 0, DataError, "'", path, "' byte offset 8: negative token count ",
             num_tokens);

  const TokenType type = header_of(kind).type;
  const uint64_t expected = kLlmcHeaderBytes + uint64_t(num_tokens) * token_type_size(type);
  FSDP_CHECK(size >= expected, DataError, "'", path, "': truncated at byte offset ", size,
             ": the header (byte offset 8) promises ", num_tokens, " tokens (",
             token_type_name(type), "), which end at byte ", expected);
  FSDP_CHECK(size == expected, DataError, "'", path, "': ", size - expected,
             " unexpected bytes from byte offset ", expected, " after the ", num_tokens,
             " tokens (", token_type_name(type), ") the header (byte offset 8) announces");

  if (format != nullptr) *format = kind;
  TokenArray array;
  array.bytes = file->data() + kLlmcHeaderBytes;
  array.count = static_cast<uint64_t>(num_tokens);
  array.type = type;
  array.file = path;
  array.file_offset = kLlmcHeaderBytes;
  array.owner = std::move(file);
  return array;
}

void write_llmc_shard(const std::string& path, const int32_t* tokens, uint64_t count,
                      LlmcShardFormat format) {
  FSDP_CHECK(format != LlmcShardFormat::fsdp_uint32, ValueError, "'", path,
             "': fsdp.cpp's version 2 shards are only read; write llm.c's Llama 3 shards for "
             "32-bit tokens");
  FSDP_CHECK(count <= uint64_t(std::numeric_limits<int32_t>::max()), ValueError, "'", path,
             "': ", count, " tokens do not fit one llm.c shard (at most 2^31 - 1)");
  const Header h = header_of(format);
  const bool narrow = h.type == TokenType::u16;
  for (uint64_t i = 0; i < count; ++i) {
    // int32 tokens always fit uint32; only negative ones do not.
    FSDP_CHECK(tokens[i] >= 0 && (!narrow || tokens[i] < 65536), ValueError, "'", path,
               "': token ", tokens[i], " at index ", i, " does not fit an ",
               llmc_format_name(format), " shard");
  }

  int32_t header[kLlmcHeaderInts] = {};
  header[0] = h.magic;
  header[1] = h.version;
  header[2] = static_cast<int32_t>(count);
  FileWriter out(path);
  out.write(header, sizeof(header));
  // Narrow in chunks so big shards need no second full-size buffer.
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<uint16_t> narrow16;
  std::vector<uint32_t> wide32;
  for (uint64_t first = 0; first < count; first += kChunk) {
    const uint64_t n = std::min(kChunk, count - first);
    if (narrow) {
      narrow16.assign(tokens + first, tokens + first + n);
      out.write(narrow16.data(), n * sizeof(uint16_t));
    } else {
      wide32.assign(tokens + first, tokens + first + n);
      out.write(wide32.data(), n * sizeof(uint32_t));
    }
  }
  out.close();
}

}  // namespace fsdp::data
