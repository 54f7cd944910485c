// Damage done to checkpoint files by the tests that check it is found: a flipped byte, and
// where a tensor's data lies in its safetensors file.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::testing {

// Flips one bit of the byte at `offset` of file `path`; false if the file could not be
// read and written there.
bool flip_byte(const std::string& path, uint64_t offset);

// Byte offset in the safetensors file `path` of the middle of tensor `name`'s data.
uint64_t middle_of(const std::string& path, const std::string& name);

}  // namespace fsdp::testing
