// An llm.c token shard: the 1024-byte header (magic, version, token count) against the file.
// Property: an accepted shard's tokens all lie inside the file and can be read, with the width
// its kind gives them (uint16 for llm.c's GPT-2 shards, uint32 for the others).
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  static fuzz::ScratchFile file(".bin");
  const std::string& path = file.write(fuzz::bytes_of(data, size));
  try {
    data::LlmcShardFormat format;
    data::TokenArray tokens = data::open_llmc_shard(path, &format);
    const int width = format == data::LlmcShardFormat::gpt2 ? 2 : 4;
    if (data::token_type_size(tokens.type) != width)
      fuzz::property_failed("tokens of another width than the shard's kind");
    const uint64_t n = tokens.count;
    if (tokens.byte_offset(n) != size) fuzz::property_failed("accepted tokens do not end the file");
    if (n > 0) {
      (void)tokens.at(0);
      (void)tokens.at(n - 1);
      std::vector<int32_t> out(std::min<uint64_t>(n, 16));
      tokens.copy_to(n - out.size(), out.size(), out.data());
    }
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
