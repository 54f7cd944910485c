// TensorBoard event files, written by hand: no protobuf or TensorFlow dependency.
//
// An event file is a sequence of records, each
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   `length` bytes of data      | uint32 masked CRC32C of the data
// where the data is one serialized tensorflow.Event protobuf. The first event carries only
// file_version "brain.Event:2"; each scalar is then an Event{wall_time, step,
// summary: Summary{value: [Value{tag, simple_value}]}}, which TensorBoard shows in its
// Scalars tab. Only the few protobuf fields below are written:
//   Event:   wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
//            summary = 5 (Summary)
//   Summary: value = 1 (repeated Value)
//   Value:   tag = 1 (string), simple_value = 2 (float)
//
// What the trainer writes (rank 0, at each logged step; tags as TensorBoard groups them by
// the part before the slash):
//   train/loss, train/lr, train/grad_norm, train/tokens_per_sec, train/step_time_s,
//   train/mfu (when known), train/memory_peak_gib, val/loss (when validation ran),
//   moe/aux_loss, moe/z_loss, moe/max_load (MoE models) and update_norm/<group>
//   (logger.log_update_norms): add_step_metrics() writes exactly these.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/train/metrics.h"

namespace fsdp::train {

// CRC32C (Castagnoli polynomial, reflected), and TensorFlow's masking of it for records
// (a CRC stored next to the bytes it covers is rotated and offset, so that a CRC of a CRC is
// not trivially valid).
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// Appends events to DIR/RUN_NAME/events.out.tfevents.<seconds>.<host>.<pid> (created with
// its parent directories; a new file per writer, as TensorBoard expects). Writes the
// file_version event at once. Throws IoError naming the file when a write fails. Not thread
// safe; one writer per process (rank 0).
class TensorBoardWriter {
 public:
  TensorBoardWriter(const std::string& dir, const std::string& run_name);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar event: tag (e.g. "train/loss"), optimizer step, value (stored as float).
  void add_scalar(const std::string& tag, int64_t step, double value);
  // The scalars listed at the top of this file for one logged step.
  void add_step_metrics(const StepMetrics& m);
  // Pushes what was written to the operating system (TensorBoard reads files as they grow).
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace fsdp::train
