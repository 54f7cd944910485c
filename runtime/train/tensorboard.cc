#include "runtime/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "runtime/core/error.h"

namespace fsdp::train {
namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial 0x82F63B78.
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// ---- the protobuf wire format, only what the three messages need
// A field's key is (number << 3) | wire type: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (uint64_t(field) << 3) | uint64_t(wire_type));
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86 and arm64 hosts are little-endian
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// An Event with wall_time and step; the caller adds file_version or summary.
std::string event_header(int64_t step) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  put_key(event, 1, 1);  // wall_time: double
  put_little_endian(event, wall_time);
  put_key(event, 2, 0);  // step: int64 (varint; negative steps take ten bytes, as protobuf)
  put_varint(event, uint64_t(step));
  return event;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();  // constant, built once
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& run_name) {
  FSDP_CHECK(!dir.empty(), ConfigError, "TensorBoard: the log directory is empty");
  const std::filesystem::path run_dir = std::filesystem::path(dir) / run_name;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  FSDP_CHECK(!ec, IoError, "TensorBoard: cannot create ", run_dir.string(), ": ", ec.message());
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  path_ = (run_dir / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                      std::to_string(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  FSDP_CHECK(file_ != nullptr, IoError, "TensorBoard: cannot create ", path_, ": ",
             std::strerror(errno));
  std::string event = event_header(0);
  put_bytes(event, 3, "brain.Event:2");  // file_version
  write_record(event);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // A failure to close here can only be ignored (destructors do not throw); flush() reports it.
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);  // Value.tag
  put_key(summary_value, 2, 5);      // Value.simple_value: float
  put_little_endian(summary_value, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, summary_value);  // Summary.value
  std::string event = event_header(step);
  put_bytes(event, 5, summary);  // Event.summary
  write_record(event);
}

void TensorBoardWriter::add_step_metrics(const StepMetrics& m) {
  add_scalar("train/loss", m.step, m.loss);
  add_scalar("train/lr", m.step, m.lr);
  add_scalar("train/grad_norm", m.step, m.grad_norm);
  add_scalar("train/tokens_per_sec", m.step, m.tokens_per_sec);
  add_scalar("train/step_time_s", m.step, m.step_time_s);
  add_scalar("train/memory_peak_gib", m.step, double(m.mem_peak_bytes) / double(1 << 30));
  if (m.mfu) add_scalar("train/mfu", m.step, *m.mfu);
  if (m.val_loss) add_scalar("val/loss", m.step, *m.val_loss);
  if (m.moe_aux_loss) add_scalar("moe/aux_loss", m.step, *m.moe_aux_loss);
  if (m.moe_z_loss) add_scalar("moe/z_loss", m.step, *m.moe_z_loss);
  if (m.moe_max_load) add_scalar("moe/max_load", m.step, *m.moe_max_load);
  for (const auto& [group, norm] : m.update_norms) add_scalar("update_norm/" + group, m.step, norm);
}

void TensorBoardWriter::flush() {
  FSDP_CHECK(std::fflush(file_) == 0, IoError, "TensorBoard: cannot write ", path_, ": ",
             std::strerror(errno));
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string record;
  put_little_endian(record, uint64_t(event.size()));
  put_little_endian(record, masked_crc32c(record.data(), 8));
  record += event;
  put_little_endian(record, masked_crc32c(event.data(), event.size()));
  FSDP_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), IoError,
             "TensorBoard: cannot write ", path_, ": ", std::strerror(errno));
}

}  // namespace fsdp::train
