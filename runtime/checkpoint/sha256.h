// SHA-256 (FIPS 180-4), streaming: the checksum a checkpoint records for every file and
// every tensor, so that `sha256sum` gives the same digests as metadata.json.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::checkpoint {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The digest as 64 lowercase hex digits. Ends the computation: call update() no more.
  std::string hex_digest();

 private:
  void compress(const unsigned char* block);

  std::array<uint32_t, 8> state_;
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

// The digest of a whole byte string (tests, small texts).
std::string sha256_hex(const std::string& bytes);

}  // namespace fsdp::checkpoint
