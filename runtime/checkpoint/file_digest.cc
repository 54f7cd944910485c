#include "runtime/checkpoint/file_digest.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/core/error.h"

namespace fsdp::checkpoint {

FileDigest digest_safetensors_file(const std::string& path) {
  // The reader validates the header and tells where each tensor's bytes are; the data
  // section is then streamed once, each chunk feeding the file's digest and its tensor's.
  uint64_t data_start = 0;
  std::vector<SafetensorsEntry> entries;
  {
    SafetensorsReader reader(path);
    entries = reader.entries();
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  FSDP_CHECK(file != nullptr, IoError, path, ": cannot open: ", std::strerror(errno));

  FileDigest out;
  Sha256 whole;
  unsigned char len_bytes[8];
  FSDP_CHECK(std::fread(len_bytes, 1, 8, file.get()) == 8, IoError, path, ": cannot read");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  whole.update(len_bytes, 8);
  data_start = 8 + header_len;

  std::vector<unsigned char> buf(size_t(1) << 20);
  auto feed = [&](uint64_t n, Sha256* part, const std::string& what) {
    while (n > 0) {
      const size_t want = size_t(std::min<uint64_t>(n, buf.size()));
      const size_t got = std::fread(buf.data(), 1, want, file.get());
      FSDP_CHECK(got == want, IoError, path, ": ", what, ": read ", got, " of ", want,
                 " bytes (file changed while reading?)");
      whole.update(buf.data(), got);
      if (part) part->update(buf.data(), got);
      n -= got;
    }
  };
  feed(header_len, nullptr, "header");
  for (const SafetensorsEntry& e : entries) {
    Sha256 tensor;
    feed(e.nbytes(), &tensor, "tensor \"" + e.name + "\"");
    out.tensors[e.name] = tensor.hex_digest();
  }
  // Nothing may follow the last tensor (the reader checked); the file size is what was read.
  out.bytes = data_start + (entries.empty() ? 0 : entries.back().end);
  out.sha256 = whole.hex_digest();
  return out;
}

}  // namespace fsdp::checkpoint
