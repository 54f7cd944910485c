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

TokenType token_type_for_version(int32_t version) {
  return version == 1 ? TokenType::u16 : TokenType::u32;
}

}  // namespace

TokenArray open_llmc_shard(const std::string& path) {
  auto file = std::make_shared<const MappedFile>(path);
  const uint64_t size = file->size();
  FSDP_CHECK(size >= kLlmcHeaderBytes, DataError, "'", path, "': truncated llm.c shard at byte offset ",
             size, ": the header needs ", kLlmcHeaderBytes, " bytes");
  int32_t header[kLlmcHeaderInts];
  std::memcpy(header, file->data(), kLlmcHeaderBytes);

  FSDP_CHECK(header[0] == kLlmcMagic, DataError, "'", path, "' byte offset 0: bad magic ",
             header[0], ", expected ", kLlmcMagic, " (not an llm.c token shard)");
  const int32_t version = header[1];
  FSDP_CHECK(version == 1 || version == 2, DataError, "'", path,
             "' byte offset 4: unsupported llm.c shard version ", version,
             " (1: uint16 tokens, 2: uint32 tokens)");
  const int32_t num_tokens = header[2];
  FSDP_CHECK(num_tokens >= 0, DataError, "'", path, "' byte offset 8: negative token count ",
             num_tokens);

  const TokenType type = token_type_for_version(version);
  const uint64_t expected = kLlmcHeaderBytes + uint64_t(num_tokens) * token_type_size(type);
  FSDP_CHECK(size >= expected, DataError, "'", path, "': truncated at byte offset ", size,
             ": the header (byte offset 8) promises ", num_tokens, " tokens, which end at byte ",
             expected);
  FSDP_CHECK(size == expected, DataError, "'", path, "': ", size - expected,
             " unexpected bytes from byte offset ", expected, " after the ", num_tokens,
             " tokens the header (byte offset 8) announces");

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
                      int version) {
  FSDP_CHECK(version == 1 || version == 2, ValueError, "llm.c shard version must be 1 or 2, got ",
             version);
  FSDP_CHECK(count <= uint64_t(std::numeric_limits<int32_t>::max()), ValueError, "'", path,
             "': ", count, " tokens do not fit one llm.c shard (at most 2^31 - 1)");
  const int64_t limit = version == 1 ? 65536 : int64_t(1) << 32;
  for (uint64_t i = 0; i < count; ++i) {
    FSDP_CHECK(tokens[i] >= 0 && tokens[i] < limit, ValueError, "'", path, "': token ",
               tokens[i], " at index ", i, " does not fit an llm.c version ", version,
               " shard (", token_type_name(token_type_for_version(version)), ")");
  }

  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  FileWriter out(path);
  out.write(header, sizeof(header));
  // Narrow in chunks so big shards need no second full-size buffer.
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<uint16_t> narrow16;
  std::vector<uint32_t> narrow32;
  for (uint64_t first = 0; first < count; first += kChunk) {
    const uint64_t n = std::min(kChunk, count - first);
    if (version == 1) {
      narrow16.assign(tokens + first, tokens + first + n);
      out.write(narrow16.data(), n * sizeof(uint16_t));
    } else {
      narrow32.assign(tokens + first, tokens + first + n);
      out.write(narrow32.data(), n * sizeof(uint32_t));
    }
  }
  out.close();
}

}  // namespace fsdp::data
