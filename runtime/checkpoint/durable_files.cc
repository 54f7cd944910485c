#include "runtime/checkpoint/durable_files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/core/error.h"

namespace fsdp::checkpoint {
namespace {

std::string parent_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, IoError, path, ": cannot open to flush it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are still atomic.
  FSDP_CHECK(rc == 0 || err == EINVAL, IoError, path, ": fsync failed: ", std::strerror(err));
}

void rename_durably(const std::string& from, const std::string& to) {
  FSDP_CHECK(std::rename(from.c_str(), to.c_str()) == 0, IoError, "cannot rename ", from, " to ",
             to, ": ", std::strerror(errno));
  fsync_path(parent_of(to));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    FSDP_CHECK(f != nullptr, IoError, tmp, ": cannot create: ", std::strerror(errno));
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool flushed = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
    const bool closed = std::fclose(f) == 0;
    if (!written || !flushed || !closed) {
      const int err = errno;
      std::remove(tmp.c_str());
      FSDP_THROW(IoError, tmp, ": write failed: ", std::strerror(err));
    }
  }
  rename_durably(tmp, path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), IoError, path, ": cannot open: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  FSDP_CHECK(!in.bad(), IoError, path, ": read failed");
  return ss.str();
}

int64_t file_size_or_missing(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return int64_t(st.st_size);
}

}  // namespace fsdp::checkpoint
