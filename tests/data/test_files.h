// Small helpers for the data tests: scratch paths under $TEST_TMPDIR and raw file writing.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace fsdp::testing {

// A path for a scratch file: $TEST_TMPDIR/name (the current directory outside Bazel).
inline std::string scratch_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : ".") + "/" + name;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Appends the little-endian bytes of a value.
template <typename T>
void put(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Overwrites the bytes of a value at a byte offset.
template <typename T>
void poke(std::string& bytes, std::size_t offset, T value) {
  bytes.replace(offset, sizeof(T), reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace fsdp::testing
