// The data loader the trainer calls: micro-batches of (inputs, targets) for one data-parallel
// rank, from any data format, in an order that does not depend on the number of ranks.
//
// Order. The data set is a sequence of samples of T + 1 tokens (SampleSource). Global sample
// g is sample g % N of epoch g / N (N samples per epoch); with shuffling on (the default, for
// every format), epoch e reads its samples in a seeded permutation of all N drawn anew for
// each epoch: a uniform shuffle of the windows across every file of the data set, so two
// consecutive samples are rarely neighbours in the text. At every micro-step the dp ranks
// together read the next dp * B global samples, rank r the B from r * B on: runs with
// different world sizes (and micro-batch sizes) see identical global batches.
//
// Position. The loader's position is the number of global samples all ranks have consumed
// together, so it survives a change of world size or micro-batch size on resume.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/sample_source.h"
#include "runtime/data/token_stream_source.h"

namespace fsdp::data {

enum class DataFormat { text, llmc, megatron };
DataFormat parse_data_format(const std::string& name);  // "text" | "llmc" | "megatron"; ConfigError
const char* data_format_name(DataFormat format);

// Where samples come from.
struct DataSpec {
  DataFormat format = DataFormat::text;
  // text: a file or glob of UTF-8 files (one document each); llmc: a glob of shards;
  // megatron: the path prefix of PREFIX.bin / PREFIX.idx.
  std::string path;
  // A held-out split: `head` uses all but the last holdout_fraction of the data, `tail` only
  // that last part (tokens for text and llm.c, whole documents for Megatron).
  DataSplit split = DataSplit::all;
  double holdout_fraction = 0;
  // What the caller calls this data, for messages ("validation split (dataset.val_fraction =
  // 0.05)"); they read "LABEL of llm.c shards 'PATH' (tokens [95, 100) of 100): ...". Empty:
  // no label; a split's range is named either way.
  std::string label;
  // Shuffle the sample order per epoch (and, for Megatron, the document order); off reads
  // the data in file order (validation, debugging).
  bool shuffle = true;
  // text only: the tokenizer files; empty = the shipped GPT-2 files (locate_asset).
  std::string vocab_file;
  std::string merges_file;
};

// Opens the data a spec names, for samples of seq_len + 1 tokens. DataError for missing or
// malformed files (naming file and offset) and for data too small for one sample.
std::unique_ptr<SampleSource> open_sample_source(const DataSpec& spec, int64_t seq_len,
                                                 uint64_t seed);

class DataLoader {
 public:
  DataLoader(const DataSpec& spec, int64_t micro_batch_size, int64_t seq_len, int dp_rank,
             int dp_size, uint64_t seed);
  // For sources built by hand; shuffle_samples as DataSpec::shuffle.
  DataLoader(std::unique_ptr<SampleSource> source, int64_t micro_batch_size, int dp_rank,
             int dp_size, uint64_t seed, bool shuffle_samples);

  // This rank's next micro-batch: inputs and targets, each (B, T) row-major; targets are
  // inputs shifted left by one token.
  void next(int32_t* inputs, int32_t* targets);

  // Global samples consumed by all ranks together: dp_size * micro_batch_size per next().
  uint64_t position() const { return next_sample_ - uint64_t(dp_rank_ * micro_batch_size_); }
  // Resume at a position() of an earlier run, of any world size and micro-batch size.
  void seek(uint64_t global_samples);

  // Where global samples [first, first + count) come from (what a step read, for replaying
  // it elsewhere): each one's epoch and index in the source.
  struct SampleRef {
    uint64_t epoch = 0, index = 0;
  };
  std::vector<SampleRef> sample_refs(uint64_t first, uint64_t count);
  const SampleSource& source() const { return *source_; }

  uint64_t num_samples() const { return source_->num_samples(); }  // per epoch
  // DataError naming file and byte offset of the first token >= vocab_size (or < 0).
  void vocab_check(int64_t vocab_size) const { source_->check_vocab(vocab_size); }

  int64_t micro_batch_size() const { return micro_batch_size_; }
  int64_t seq_len() const { return source_->seq_len(); }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_size_; }
  std::string describe() const;

 private:
  SampleRef locate(uint64_t global_sample);  // epoch and (shuffled) index of a global sample

  std::unique_ptr<SampleSource> source_;
  int64_t micro_batch_size_;
  int dp_rank_;
  int dp_size_;
  uint64_t seed_;
  bool shuffle_samples_;
  uint64_t next_sample_;  // the global sample this rank's next micro-batch starts with

  std::vector<int32_t> sample_;  // (T + 1) scratch
  uint64_t order_epoch_ = 0;     // epoch whose permutation `order_` holds
  std::vector<uint64_t> order_;  // (N) sample order of that epoch; empty if not drawn
};

}  // namespace fsdp::data
