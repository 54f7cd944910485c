// Reading a native checkpoint directory under any layout: element ranges of any parameter's
// state, found through metadata.json's pieces and read as slices of the shard files, so a
// reader touches only the bytes it needs.
//
// Everything is checked and every error is a CheckpointError naming the file (and tensor):
// metadata.json itself (see CheckpointMetadata::parse); a missing or short shard file; a
// shard file whose header lists a tensor metadata.json does not, lacks one it does, or
// gives one another dtype or size; and, in verify_file(), a SHA-256 that differs from the
// recorded one (the message names the tensor whose bytes changed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/checkpoint/metadata.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::checkpoint {

class CheckpointReader {
 public:
  // Reads and checks dir/metadata.json.
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  const CheckpointMetadata& metadata() const { return metadata_; }
  std::string file_path(size_t file) const;

  // Every file exists and has its recorded size (a short file: the error names the first
  // tensor it cuts). Cheap: no data is read.
  void check_files_present() const;
  // Reads file `file` in full: header against metadata.json, then SHA-256 of the file and,
  // on a mismatch, of each tensor to name the one that differs.
  void verify_file(size_t file);
  // check_files_present(), then verify_file() of every file: what a single process that
  // reads a whole checkpoint (convert export, generate) does before reading any weight.
  // (load_checkpoint() spreads the files over the ranks instead.)
  void verify_all_files();

  // Elements [offset, offset + numel) of parameter `param`'s state `kind` ("main",
  // "exp_avg", "exp_avg_sq"), in the checkpoint's dtype for that kind, into host memory.
  void read(const std::string& kind, const std::string& param, int64_t offset, int64_t numel,
            void* dst);
  // A whole parameter's state as a host tensor of its shape, in the checkpoint's dtype.
  Tensor read_parameter(Context& ctx, const std::string& kind, const std::string& param);
  // A buffer (metadata.h) as a host tensor of its shape, in its stored dtype.
  Tensor read_buffer(Context& ctx, const std::string& name);

  // Tensor bytes read by read() so far, and the shard files opened (by read() or
  // verify_file()): a reader touches only what it needs.
  uint64_t bytes_read() const { return bytes_read_; }
  size_t files_opened() const;

 private:
  // The file's reader, opened on first use with its header checked against metadata.json.
  SafetensorsReader& open(size_t file);
  void check_header(const SafetensorsReader& reader, const FileRecord& record) const;

  std::string dir_;
  CheckpointMetadata metadata_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  uint64_t bytes_read_ = 0;
};

// The checkpoint directory a path names: a checkpoint itself (it holds metadata.json), or a
// save directory whose `latest` marker names one. "" when it is neither (no such path, or a
// save directory without a complete checkpoint yet).
std::string find_checkpoint(const std::string& path);

// The newest step_NNNNNN directory of save directory `save_dir` that holds a metadata.json
// (a save renames a step's directory into place only when it is complete), or "" if none:
// where to resume when the `latest` marker is missing.
std::string newest_step_directory(const std::string& save_dir);

}  // namespace fsdp::checkpoint
