#include "runtime/checkpoint/checkpoint_reader.h"

#include <filesystem>

#include <algorithm>
#include <set>

#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/file_digest.h"
#include "runtime/checkpoint/save.h"

namespace fsdp::checkpoint {

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string path = dir_ + "/" + kMetadataFileName;
  FSDP_CHECK(file_size_or_missing(path) >= 0, CheckpointError, dir_, ": no ", kMetadataFileName,
             " (not a checkpoint, or the remains of an interrupted save)");
  metadata_ = CheckpointMetadata::parse(read_text_file(path), path);
  readers_.resize(metadata_.files.size());
}

CheckpointReader::~CheckpointReader() = default;

std::string CheckpointReader::file_path(size_t file) const {
  return dir_ + "/" + metadata_.files.at(file).name;
}

void CheckpointReader::check_files_present() const {
  for (size_t i = 0; i < metadata_.files.size(); ++i) {
    const FileRecord& f = metadata_.files[i];
    const std::string path = file_path(i);
    const int64_t size = file_size_or_missing(path);
    FSDP_CHECK(size >= 0, CheckpointError, path, ": shard file missing (listed in ",
               kMetadataFileName, ")");
    if (uint64_t(size) == f.bytes) continue;
    // Name the first tensor whose bytes a short file no longer holds (data runs from the
    // end of the file backwards: tensors are stored in the order listed).
    uint64_t data_bytes = 0;
    for (const TensorRecord& t : f.tensors) data_bytes += uint64_t(t.numel) * dtype_size(t.dtype);
    const uint64_t header = f.bytes - data_bytes;
    std::string cut;
    uint64_t end = header;
    for (const TensorRecord& t : f.tensors) {
      end += uint64_t(t.numel) * dtype_size(t.dtype);
      if (end > uint64_t(size)) {
        cut = t.name;
        break;
      }
    }
    FSDP_THROW(CheckpointError, path, ": ", size, " bytes where ", kMetadataFileName, " records ",
               f.bytes, uint64_t(size) < f.bytes ? " (truncated" : " (bytes appended",
               cut.empty() ? std::string(")") : ": tensor \"" + cut + "\" is incomplete)");
  }
}

void CheckpointReader::check_header(const SafetensorsReader& reader, const FileRecord& record) const {
  const std::string& path = reader.path();
  std::set<std::string> listed;
  for (const TensorRecord& t : record.tensors) {
    listed.insert(t.name);
    FSDP_CHECK(reader.contains(t.name), CheckpointError, path, ": tensor \"", t.name,
               "\" is missing (", kMetadataFileName, " lists it)");
    const SafetensorsEntry& e = reader.entry(t.name);
    FSDP_CHECK(e.dtype == t.dtype && e.shape == Shape{t.numel}, CheckpointError, path, ": tensor \"",
               t.name, "\" is ", safetensors_dtype_name(e.dtype), " ", e.shape, " but ",
               kMetadataFileName, " says ", safetensors_dtype_name(t.dtype), " (", t.numel, ")");
  }
  for (const SafetensorsEntry& e : reader.entries())
    FSDP_CHECK(listed.count(e.name), CheckpointError, path, ": holds tensor \"", e.name,
               "\", which ", kMetadataFileName, " does not list");
}

SafetensorsReader& CheckpointReader::open(size_t file) {
  std::unique_ptr<SafetensorsReader>& r = readers_.at(file);
  if (r) return *r;
  const std::string path = file_path(file);
  FSDP_CHECK(file_size_or_missing(path) >= 0, CheckpointError, path,
             ": shard file missing (listed in ", kMetadataFileName, ")");
  auto reader = std::make_unique<SafetensorsReader>(path);
  check_header(*reader, metadata_.files[file]);
  r = std::move(reader);
  return *r;
}

void CheckpointReader::verify_file(size_t file) {
  const FileRecord& record = metadata_.files.at(file);
  const std::string path = file_path(file);
  check_header(open(file), record);
  const FileDigest d = digest_safetensors_file(path);
  if (d.sha256 == record.sha256 && d.bytes == record.bytes) return;
  for (const TensorRecord& t : record.tensors) {
    auto it = d.tensors.find(t.name);
    FSDP_CHECK(it != d.tensors.end() && it->second == t.sha256, CheckpointError, path,
               ": checksum mismatch in tensor \"", t.name, "\" (SHA-256 of its bytes is ",
               it == d.tensors.end() ? std::string("-") : it->second, ", ", kMetadataFileName,
               " records ", t.sha256, ")");
  }
  FSDP_THROW(CheckpointError, path, ": checksum mismatch in the file's header (SHA-256 ", d.sha256,
             ", ", kMetadataFileName, " records ", record.sha256, ")");
}

void CheckpointReader::verify_all_files() {
  check_files_present();
  for (size_t i = 0; i < metadata_.files.size(); ++i) verify_file(i);
}

void CheckpointReader::read(const std::string& kind, const std::string& param, int64_t offset,
                            int64_t numel, void* dst) {
  const ParamRecord* p = metadata_.find_param(param);
  FSDP_CHECK(p != nullptr, CheckpointError, dir_, ": no parameter \"", param, "\"");
  FSDP_CHECK(offset >= 0 && numel >= 0 && offset + numel <= p->shape.numel(), IndexError, dir_,
             ": parameter \"", param, "\": elements [", offset, ", ", offset + numel,
             ") are outside its ", p->shape.numel());
  const DType dtype = metadata_.dtype_of_kind(kind);
  const size_t esize = dtype_size(dtype);
  const std::string tensor = state_tensor_name(kind, p->unit);
  char* out = static_cast<char*>(dst);
  // The pieces are sorted and cover the parameter: visit those overlapping the range.
  for (const ParamPiece& piece : p->pieces) {
    const int64_t lo = std::max(offset, piece.param_offset);
    const int64_t hi = std::min(offset + numel, piece.param_offset + piece.numel);
    if (lo >= hi) continue;
    const int64_t at = piece.tensor_offset + (lo - piece.param_offset);
    open(size_t(piece.file)).read_bytes(tensor, uint64_t(at) * esize,
                                        out + size_t(lo - offset) * esize, uint64_t(hi - lo) * esize);
    bytes_read_ += uint64_t(hi - lo) * esize;
  }
}

size_t CheckpointReader::files_opened() const {
  size_t n = 0;
  for (const auto& r : readers_) n += r != nullptr;
  return n;
}

Tensor CheckpointReader::read_parameter(Context& ctx, const std::string& kind, const std::string& param) {
  const ParamRecord* p = metadata_.find_param(param);
  FSDP_CHECK(p != nullptr, CheckpointError, dir_, ": no parameter \"", param, "\"");
  Tensor out = ctx.empty_host(p->shape, metadata_.dtype_of_kind(kind));
  read(kind, param, 0, p->shape.numel(), out.numel() ? out.data_ptr() : nullptr);
  return out;
}

Tensor CheckpointReader::read_buffer(Context& ctx, const std::string& name) {
  const BufferRecord* b = metadata_.find_buffer(name);
  FSDP_CHECK(b != nullptr, CheckpointError, dir_, ": no buffer \"", name, "\"");
  const std::string tensor = state_tensor_name(kBuffer, name);
  SafetensorsReader& file = open(size_t(b->file));
  const SafetensorsEntry& e = file.entry(tensor);
  Tensor out = ctx.empty_host(b->shape, e.dtype);
  file.read_bytes(tensor, 0, out.numel() ? out.data_ptr() : nullptr, out.nbytes());
  bytes_read_ += out.nbytes();
  return out;
}

std::string find_checkpoint(const std::string& path) {
  if (file_size_or_missing(path + "/" + kMetadataFileName) >= 0) return path;
  const std::string latest = read_latest_marker(path);
  if (latest.empty()) return "";
  const std::string dir = path + "/" + latest;
  FSDP_CHECK(file_size_or_missing(dir + "/" + kMetadataFileName) >= 0, CheckpointError, path,
             "/latest names ", latest, ", which holds no ", kMetadataFileName);
  return dir;
}

std::string newest_step_directory(const std::string& save_dir) {
  std::error_code ec;
  int64_t best = -1;
  for (const auto& entry : std::filesystem::directory_iterator(save_dir, ec)) {
    const int64_t step = step_of_directory_name(entry.path().filename().string());
    if (step > best && file_size_or_missing(entry.path().string() + "/" + kMetadataFileName) >= 0)
      best = step;
  }
  return best < 0 ? "" : save_dir + "/" + step_directory_name(best);
}

}  // namespace fsdp::checkpoint
