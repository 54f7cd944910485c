// The safetensors format: read and write named tensors.
//
// Layout: 8 bytes little-endian u64 N, then N bytes of JSON header, then the data section.
// The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]} (byte offsets into the data section), plus an optional "__metadata__" object
// of string values. Dtypes handled: F32, BF16, F16, F64, I64, I32, U16, U8.
//
// Reading is strict, and every error names the file (and the tensor where there is one):
// a truncated file, a header that is not the JSON described above, an unknown dtype, a byte
// range that does not match dtype x shape, ranges out of the data section, overlapping, or
// leaving holes or trailing bytes. Errors are CheckpointError (bad content) or IoError (the
// file cannot be opened or read).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::checkpoint {

// The safetensors dtype name of a DType ("F32", "BF16", ...), and back (CheckpointError for
// names outside the list above).
const char* safetensors_dtype_name(DType t);
DType dtype_from_safetensors(const std::string& name);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte range within the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsReader {
 public:
  // Opens and validates `path` (the header only; data is read on demand).
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Entries in the order of their data (ascending offsets).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  // The entry called `name`; CheckpointError naming the file if absent.
  const SafetensorsEntry& entry(const std::string& name) const;

  // Reads `nbytes` bytes of tensor `name`, starting `byte_offset` bytes into it, to `dst`
  // (host memory): a slice of a tensor can be read on its own.
  void read_bytes(const std::string& name, uint64_t byte_offset, void* dst, uint64_t nbytes);
  // The whole tensor, on ctx's device (or the host when on_host).
  Tensor load(Context& ctx, const std::string& name, bool on_host = false);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t data_start_ = 0;  // file offset of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file tensor by tensor, so a large model never needs all its bytes in
// host memory at once: declare() every tensor (its data is laid out in declaration order),
// then write() each one's bytes in that same order, then finish(). The file appears under
// `path` only at finish() (written to path + ".tmp" and renamed).
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();  // an unfinished file is removed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void declare(const std::string& name, DType dtype, const Shape& shape);
  // The bytes of the next declared tensor, which must be `name`; may be given in several
  // consecutive pieces whose sizes add up to the tensor's.
  void write(const std::string& name, const void* data, uint64_t nbytes);
  void finish();

 private:
  void begin_data();
  std::string path_;
  std::string tmp_path_;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::FILE* file_ = nullptr;
  size_t next_ = 0;           // index of the tensor being written
  uint64_t written_ = 0;      // bytes of it written so far
  bool finished_ = false;
};

// Convenience: writes named tensors (any device, any layout: copied to the host
// contiguously) in the given order.
void save_safetensors(Context& ctx, const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace fsdp::checkpoint
