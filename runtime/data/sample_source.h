// What the data loader reads from: a data set seen as a sequence of training samples of
// seq_len + 1 tokens (inputs are a sample's first seq_len tokens, targets its last seq_len).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;

  virtual int64_t seq_len() const = 0;       // T; a sample has T + 1 tokens
  virtual uint64_t num_samples() const = 0;  // samples in one epoch, > 0
  // Sample `index` (< num_samples()) as laid out in epoch `epoch` (sources that reorder
  // documents per epoch use it; others ignore it): T + 1 tokens into out.
  virtual void read_sample(uint64_t epoch, uint64_t index, int32_t* out) = 0;
  // DataError naming the file and byte offset of the first token outside [0, vocab_size).
  virtual void check_vocab(int64_t vocab_size) const = 0;
  // Where sample `index` of epoch `epoch` starts in the concatenation of the data files'
  // tokens, for sources that cut one token stream into samples (the sample is the T + 1
  // tokens from there); null for sources that assemble samples otherwise.
  virtual std::optional<uint64_t> stream_offset(uint64_t /*epoch*/, uint64_t /*index*/) const {
    return std::nullopt;
  }
  // One line for logs: format, path, size.
  virtual std::string describe() const = 0;
};

}  // namespace fsdp::data
