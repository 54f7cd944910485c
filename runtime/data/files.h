// File access shared by the data formats: whole-file reads, read-only memory maps of token
// files, globbing, and checked writing. Every error names the path (and the OS's reason).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace fsdp::data {

// A little-endian value at p; files give no alignment guarantee, so it is copied out.
template <typename T>
T load_le(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// The whole file as bytes. DataError if it cannot be opened or read.
std::string read_file(const std::string& path);

// Files matching a shell pattern (*, ?, [...]), sorted by name. A pattern without wildcards
// names one file, which must exist. DataError if nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

// A file mapped read-only into memory for as long as the object lives.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // DataError if missing or unreadable
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Writes a file from scratch; IoError (naming the file) on any failure, including at close.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();  // closes without reporting; call close() to see errors
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* bytes, std::size_t count);
  template <typename T>
  void write_value(const T& value) { write(&value, sizeof(T)); }  // little-endian hosts only
  uint64_t bytes_written() const { return written_; }
  void close();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;
};

}  // namespace fsdp::data
