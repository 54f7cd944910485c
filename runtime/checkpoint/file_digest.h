// SHA-256 digests of a safetensors file: of the whole file (what `sha256sum` prints) and of
// each tensor's bytes (so that a corrupted file can be reported down to the tensor), in one
// pass over the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace fsdp::checkpoint {

struct FileDigest {
  uint64_t bytes = 0;
  std::string sha256;                         // of the whole file
  std::map<std::string, std::string> tensors;  // tensor name -> SHA-256 of its bytes
};

// Reads `path` once. CheckpointError if it is not a well-formed safetensors file (naming the
// file and tensor), IoError if it cannot be read.
FileDigest digest_safetensors_file(const std::string& path);

}  // namespace fsdp::checkpoint
