// The safetensors reader: the 8-byte header length, the JSON header (dtypes, shapes, data
// offsets, __metadata__) and reads of tensor bytes, on a file of arbitrary bytes.
// Property: every entry it accepts lies inside the file, with a size that matches its shape
// and dtype, and can be read to its last byte.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  static fuzz::ScratchFile file(".safetensors");
  const std::string& path = file.write(fuzz::bytes_of(data, size));
  try {
    checkpoint::SafetensorsReader reader(path);
    std::vector<char> buffer;
    for (const checkpoint::SafetensorsEntry& e : reader.entries()) {
      if (e.end < e.begin || e.end > size) fuzz::property_failed("an entry lies outside the file");
      if (uint64_t(e.shape.numel()) * uint64_t(dtype_size(e.dtype)) != e.nbytes())
        fuzz::property_failed("an entry's size disagrees with its shape and dtype");
      // Its first and last bytes (the reader reads slices on demand).
      const uint64_t n = std::min<uint64_t>(e.nbytes(), 64);
      buffer.resize(n);
      reader.read_bytes(e.name, 0, buffer.data(), n);
      reader.read_bytes(e.name, e.nbytes() - n, buffer.data(), n);
    }
    for (const auto& kv : reader.metadata()) (void)kv;
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
