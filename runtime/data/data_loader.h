// The data loader the trainer calls: micro-batches of (inputs, targets) for one data-parallel
// rank, from any data format, in an order that does not depend on the number of ranks.
//
// Order. The data set is a sequence of samples of T + 1 tokens (SampleSource). Global sample
// g is sample g % N of epoch g / N (N samples per epoch); with shuffling on, epoch e reads its
// samples in a seeded permutation drawn anew for each epoch. Global micro-batch k holds global
// samples [k*B, (k+1)*B). Data-parallel rank r reads global micro-batches r, r + dp, r + 2dp, ...
// So at every micro-step the dp ranks together read dp consecutive global micro-batches, the
// same ones a single process reads in dp steps: runs with different world sizes see identical
// global batches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
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
  // Shuffle sample order (and, for Megatron, document order) per epoch. Unset: on for
  // Megatron, off for the token streams (text, llm.c), as those formats' own loaders do.
  std::optional<bool> shuffle;
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

  // Global micro-batches consumed by all ranks together: dp_size per next() call.
  uint64_t position() const { return next_microbatch_ - uint64_t(dp_rank_); }
  // Resume at a position() of an earlier run (any world size that divides it): ValueError
  // unless global_microbatch is a multiple of dp_size.
  void seek(uint64_t global_microbatch);

  uint64_t num_samples() const { return source_->num_samples(); }  // per epoch
  // DataError naming file and byte offset of the first token >= vocab_size (or < 0).
  void vocab_check(int64_t vocab_size) const { source_->check_vocab(vocab_size); }

  int64_t micro_batch_size() const { return micro_batch_size_; }
  int64_t seq_len() const { return source_->seq_len(); }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_size_; }
  std::string describe() const;

 private:
  // Global sample g, T + 1 tokens, into out.
  void read_global_sample(uint64_t g, int32_t* out);

  std::unique_ptr<SampleSource> source_;
  int64_t micro_batch_size_;
  int dp_rank_;
  int dp_size_;
  uint64_t seed_;
  bool shuffle_samples_;
  uint64_t next_microbatch_;  // the global micro-batch this rank reads next

  std::vector<int32_t> sample_;  // (T + 1) scratch
  uint64_t order_epoch_ = 0;     // epoch whose permutation `order_` holds
  std::vector<uint64_t> order_;  // (N) sample order of that epoch; empty if not drawn
};

}  // namespace fsdp::data
