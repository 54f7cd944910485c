// An llm.c token shard: the 1024-byte header (magic, version, token count) against the file.
// Property: an accepted shard's tokens all lie inside the file and can be read.
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  static fuzz::ScratchFile file(".bin");
  const std::string& path = file.write(fuzz::bytes_of(data, size));
  try {
    data::TokenArray tokens = data::open_llmc_shard(path);
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
