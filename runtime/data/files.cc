#include "runtime/data/files.h"

#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/core/error.h"

// Every binary format read here is little-endian, and values are copied straight from bytes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "fsdp::data assumes a little-endian host");

namespace fsdp::data {
namespace {

std::string os_reason() { return std::strerror(errno); }

bool has_wildcard(const std::string& pattern) {
  return pattern.find_first_of("*?[") != std::string::npos;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  FSDP_CHECK(f != nullptr, DataError, "cannot open '", path, "': ", os_reason());
  std::string bytes;
  char buffer[1 << 16];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  FSDP_CHECK(!failed, DataError, "cannot read '", path, "'");
  return bytes;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  FSDP_CHECK(!pattern.empty(), DataError, "empty file pattern");
  if (!has_wildcard(pattern)) {
    struct stat st;
    FSDP_CHECK(::stat(pattern.c_str(), &st) == 0, DataError, "cannot open '", pattern,
               "': ", os_reason());
    return {pattern};
  }
  glob_t matches;
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (std::size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  FSDP_CHECK(rc == 0 || rc == GLOB_NOMATCH, DataError, "cannot expand file pattern '", pattern,
             "' (glob error ", rc, ")");
  FSDP_CHECK(!paths.empty(), DataError, "no file matches '", pattern, "'");
  std::sort(paths.begin(), paths.end());  // glob sorts by locale; make it byte order
  return paths;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  FSDP_CHECK(fd >= 0, DataError, "cannot open '", path, "': ", os_reason());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string reason = os_reason();
    ::close(fd);
    FSDP_THROW(DataError, "cannot stat '", path, "': ", reason);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    FSDP_THROW(DataError, "'", path, "' is not a regular file (", S_ISDIR(st.st_mode) ? "a directory" : "a device or pipe", ")");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string reason = os_reason();
      ::close(fd);
      FSDP_THROW(DataError, "cannot map '", path, "' (", size_, " bytes): ", reason);
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

FileWriter::FileWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  FSDP_CHECK(file_ != nullptr, IoError, "cannot create '", path, "': ", os_reason());
}

FileWriter::~FileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void FileWriter::write(const void* bytes, std::size_t count) {
  FSDP_CHECK(file_ != nullptr, IoError, "write to closed file '", path_, "'");
  if (count == 0) return;
  FSDP_CHECK(std::fwrite(bytes, 1, count, file_) == count, IoError, "cannot write '", path_,
             "': ", os_reason());
  written_ += count;
}

void FileWriter::close() {
  if (file_ == nullptr) return;
  const int rc = std::fclose(file_);
  file_ = nullptr;
  FSDP_CHECK(rc == 0, IoError, "cannot finish writing '", path_, "': ", os_reason());
}

}  // namespace fsdp::data
