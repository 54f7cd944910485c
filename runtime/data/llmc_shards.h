// llm.c token shards: a header of 256 little-endian int32 (magic 20240520, version, number
// of tokens, then zeros) followed by the tokens: uint16 for version 1 (GPT-2), uint32 for
// version 2 (llm.c's Llama 3 shards). A data set is a glob of such files read in sorted order.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/data/token_array.h"

namespace fsdp::data {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr uint64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// Maps one shard after checking its header against the file: DataError naming the file and
// byte offset for a short header, a wrong magic or version, or a size that disagrees with the
// token count (truncated or trailing bytes).
TokenArray open_llmc_shard(const std::string& path);

// Writes a shard. ValueError if a token does not fit the version's width (uint16 for
// version 1, uint32 for version 2) or there are more than 2^31 - 1 tokens; IoError on write
// failure.
void write_llmc_shard(const std::string& path, const int32_t* tokens, uint64_t count,
                      int version = 1);

}  // namespace fsdp::data
