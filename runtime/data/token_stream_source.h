// A data set that is one long token stream (llm.c shards in order, or tokenized text), cut into
// samples like llm.c does: sample i is stream tokens [i*T, i*T + T + 1), so consecutive
// samples share one token and an epoch has (tokens - 1) / T samples.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/sample_source.h"
#include "runtime/data/token_array.h"

namespace fsdp::data {

class TokenStreamSource : public SampleSource {
 public:
  // The stream is the concatenation of `pieces`, restricted to tokens [begin, end) (a held-out
  // split). DataError if that range holds fewer than T + 1 tokens. `name` is for messages.
  TokenStreamSource(std::vector<TokenArray> pieces, int64_t seq_len, uint64_t begin,
                    uint64_t end, std::string name);

  int64_t seq_len() const override { return seq_len_; }
  uint64_t num_samples() const override { return num_samples_; }
  void read_sample(uint64_t epoch, uint64_t index, int32_t* out) override;
  void check_vocab(int64_t vocab_size) const override;
  std::optional<uint64_t> stream_offset(uint64_t /*epoch*/, uint64_t index) const override {
    return begin_ + index * uint64_t(seq_len_);
  }
  std::string describe() const override;

  uint64_t total_tokens() const { return piece_starts_.back(); }  // in all pieces

 private:
  std::vector<TokenArray> pieces_;
  std::vector<uint64_t> piece_starts_;  // (pieces + 1) stream offset of each piece, then total
  int64_t seq_len_;
  uint64_t begin_, end_;
  uint64_t num_samples_;
  std::string name_;
};

// Stream tokens [begin, end) of the whole stream for a split: `all` is everything, `head` all
// but the last `fraction`, `tail` the last `fraction` (rounded down to whole tokens).
enum class DataSplit { all, head, tail };
void split_range(uint64_t total, DataSplit split, double fraction, uint64_t& begin,
                 uint64_t& end);

}  // namespace fsdp::data
