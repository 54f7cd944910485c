// The tiny training tests' data: the bytes of the shipped Austen text as tokens (vocabulary
// 256), written as one llm.c shard per rank (each rank its own copy, in its scratch
// directory named after `name`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/assets.h"
#include "runtime/data/files.h"
#include "runtime/data/llmc_shards.h"
#include "tests/test_support.h"  // from the test binary's main (catch_main or catch_main_mpi)
#include "tests/train/scratch_dir.h"

namespace fsdp::testing {

inline std::string byte_tokens_shard(const std::string& name) {
  // Found as the other data tests find it: from the working directory or the runfiles tree
  // ($TEST_SRCDIR), with an error that names every place looked at.
  const std::string text = data::read_file(data::locate_asset(data::kDefaultTextAsset));
  std::vector<int32_t> tokens(text.begin(), text.end());
  for (int32_t& t : tokens) t &= 0xff;  // bytes, not signed chars
  const std::string dir = scratch_dir(name + "_data_rank" + std::to_string(world_rank()));
  const std::string path = dir + "/austen_bytes.bin";
  data::write_llmc_shard(path, tokens.data(), tokens.size());
  return path;
}

}  // namespace fsdp::testing
