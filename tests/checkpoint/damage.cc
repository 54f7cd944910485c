#include "tests/checkpoint/damage.h"

#include <filesystem>
#include <fstream>

#include "runtime/checkpoint/safetensors.h"

namespace fsdp::testing {

bool flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(offset));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(std::streamoff(offset));
  f.write(&c, 1);
  return f.good();
}

uint64_t middle_of(const std::string& path, const std::string& name) {
  checkpoint::SafetensorsReader r(path);
  const uint64_t data_start = std::filesystem::file_size(path) - r.entries().back().end;
  const checkpoint::SafetensorsEntry& e = r.entry(name);
  return data_start + e.begin + e.nbytes() / 2;
}

}  // namespace fsdp::testing
