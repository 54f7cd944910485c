// Files that survive a crash: fsync of files and directories, atomic replacement of small
// text files (write a temporary, fsync, rename over), and durable renames. A rename is
// atomic on POSIX file systems, and fsync of the parent directory makes it durable.
// Every error is an IoError naming the path and the OS's reason.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::checkpoint {

// Flushes a file's or a directory's contents (and, for a directory, its entries) to disk.
void fsync_path(const std::string& path);

// Renames `from` to `to` (which must not be a non-empty directory) and makes it durable.
void rename_durably(const std::string& from, const std::string& to);

// Replaces `path` with `text` atomically: readers see the old file or the new one, never a
// mix, whatever happens meanwhile.
void write_file_atomically(const std::string& path, const std::string& text);

// The whole file as text. IoError if it cannot be read.
std::string read_text_file(const std::string& path);

// Size in bytes of a regular file, or -1 when there is no such file.
int64_t file_size_or_missing(const std::string& path);

}  // namespace fsdp::checkpoint
