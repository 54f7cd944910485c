#include "runtime/data/token_stream_source.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace fsdp::data {

TokenStreamSource::TokenStreamSource(std::vector<TokenArray> pieces, int64_t seq_len,
                                     uint64_t begin, uint64_t end, std::string name)
    : pieces_(std::move(pieces)), seq_len_(seq_len), begin_(begin), end_(end),
      name_(std::move(name)) {
  FSDP_CHECK(seq_len_ >= 1, ValueError, "sequence length must be at least 1, got ", seq_len_);
  piece_starts_.push_back(0);
  for (const TokenArray& piece : pieces_) piece_starts_.push_back(piece_starts_.back() + piece.count);
  FSDP_ASSERT(begin_ <= end_ && end_ <= total_tokens(), "range [", begin_, ", ", end_, ") of ",
              total_tokens());
  const uint64_t tokens = end_ - begin_;
  FSDP_CHECK(tokens >= uint64_t(seq_len_) + 1, DataError, name_, ": ", tokens,
             " tokens are too few for one sample of seq_len + 1 = ", seq_len_ + 1, " tokens");
  num_samples_ = (tokens - 1) / uint64_t(seq_len_);
}

void TokenStreamSource::read_sample(uint64_t /*epoch*/, uint64_t index, int32_t* out) {
  FSDP_ASSERT(index < num_samples_, "sample ", index, " of ", num_samples_);
  uint64_t pos = begin_ + index * uint64_t(seq_len_);
  uint64_t left = uint64_t(seq_len_) + 1;
  // The piece holding `pos`: the last one that starts at or before it (empty pieces skipped).
  std::size_t p = std::upper_bound(piece_starts_.begin(), piece_starts_.end(), pos) -
                  piece_starts_.begin() - 1;
  while (left > 0) {
    FSDP_ASSERT(p < pieces_.size(), "sample ", index, " runs past the stream");
    const uint64_t offset = pos - piece_starts_[p];
    const uint64_t n = std::min(left, pieces_[p].count - offset);
    pieces_[p].copy_to(offset, n, out);
    out += n;
    pos += n;
    left -= n;
    ++p;
  }
}

void TokenStreamSource::check_vocab(int64_t vocab_size) const {
  for (const TokenArray& piece : pieces_) piece.check_vocab(vocab_size);
}

std::string TokenStreamSource::describe() const {
  return str_cat(name_, ": ", pieces_.size(), " file(s), ", total_tokens(), " tokens, using [",
                 begin_, ", ", end_, "): ", num_samples_, " samples of ", seq_len_, "+1 tokens");
}

void split_range(uint64_t total, DataSplit split, double fraction, uint64_t& begin,
                 uint64_t& end) {
  begin = 0;
  end = total;
  if (split == DataSplit::all) return;
  FSDP_CHECK(fraction > 0 && fraction < 1, ConfigError,
             "held-out fraction must be in (0, 1), got ", fraction);
  const uint64_t tail = static_cast<uint64_t>(fraction * static_cast<double>(total));
  const uint64_t cut = total - tail;
  if (split == DataSplit::head) end = cut;
  else begin = cut;
}

}  // namespace fsdp::data
