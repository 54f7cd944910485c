// Small helpers for the data tests: scratch paths under $TEST_TMPDIR and raw file writing.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/data/assets.h"
#include "runtime/data/token_array.h"
#include "runtime/data/tokenizer.h"
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

// All tokens of an array, as int32.
inline std::vector<int32_t> all_tokens(const data::TokenArray& a) {
  std::vector<int32_t> out(a.count);
  a.copy_to(0, a.count, out.data());
  return out;
}

// The shipped GPT-2 tokenizer, loaded once per test binary.
inline data::Gpt2Tokenizer& shipped_gpt2() {
  static data::Gpt2Tokenizer tokenizer(data::locate_asset(data::kGpt2VocabAsset),
                                       data::locate_asset(data::kGpt2MergesAsset));
  return tokenizer;
}

}  // namespace fsdp::testing
