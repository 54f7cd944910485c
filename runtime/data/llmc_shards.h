// llm.c token shards: a header of 256 little-endian int32 (magic, version, number of tokens,
// then zeros) followed by the tokens. A data set is a glob of such files read in sorted order.
// The kinds read, by (magic, version):
//   20240520, 1: uint16 tokens, llm.c's GPT-2 shards ("gpt-2" in llm.c's
//                dev/data/data_common.py write_datafile)
//   20240801, 7: uint32 tokens, llm.c's Llama 3 shards ("llama-3" there)
//   20240520, 2: uint32 tokens, fsdp.cpp's own 32-bit shards, from before it wrote llm.c's
//                Llama 3 ones; not an llm.c format. Read so that such files keep working;
//                never written.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/data/token_array.h"

namespace fsdp::data {

inline constexpr int32_t kLlmcGpt2Magic = 20240520;
inline constexpr int32_t kLlmcLlama3Magic = 20240801;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr uint64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

enum class LlmcShardFormat {
  gpt2,         // llm.c's GPT-2 shards: magic 20240520, version 1, uint16 tokens
  llama3,       // llm.c's Llama 3 shards: magic 20240801, version 7, uint32 tokens
  fsdp_uint32,  // fsdp.cpp's own: magic 20240520, version 2, uint32 tokens (read only)
};

const char* llmc_format_name(LlmcShardFormat format);  // "llm.c GPT-2 (uint16)", ...

// Maps one shard after checking its header against the file: DataError naming the file and
// byte offset for a short header, a magic and version that are none of the kinds above, or a
// size that disagrees with the token count (truncated or trailing bytes). `format`, when
// given, receives the shard's kind.
TokenArray open_llmc_shard(const std::string& path, LlmcShardFormat* format = nullptr);

// Writes a shard as llm.c does (gpt2 or llama3). ValueError if a token does not fit the
// format's width, there are more than 2^31 - 1 tokens, or the format is fsdp_uint32; IoError
// on write failure.
void write_llmc_shard(const std::string& path, const int32_t* tokens, uint64_t count,
                      LlmcShardFormat format = LlmcShardFormat::gpt2);

}  // namespace fsdp::data
