#include "runtime/data/megatron_source.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/data/shuffle.h"

namespace fsdp::data {

MegatronSource::MegatronSource(std::shared_ptr<const MegatronDataset> data, int64_t seq_len,
                               uint64_t seed, bool shuffle_documents, uint64_t first_document,
                               uint64_t end_document, std::string name)
    : data_(std::move(data)), seq_len_(seq_len), seed_(seed),
      shuffle_documents_(shuffle_documents), first_document_(first_document),
      end_document_(end_document), name_(std::move(name)) {
  FSDP_CHECK(seq_len_ >= 1, ValueError, "sequence length must be at least 1, got ", seq_len_);
  FSDP_ASSERT(first_document_ <= end_document_ && end_document_ <= data_->num_documents());
  const auto& index = data_->index();
  const int64_t first_seq = index.document_indices[first_document_];
  const int64_t end_seq = index.document_indices[end_document_];
  for (int64_t s = first_seq; s < end_seq; ++s) num_tokens_ += uint64_t(index.sequence_lengths[s]);
  if (name_.empty())
    name_ = str_cat("'", data_->prefix(), "' documents [", first_document_, ", ", end_document_,
                    ")");
  FSDP_CHECK(num_tokens_ >= uint64_t(seq_len_) + 1, DataError, name_, ": ", num_tokens_,
             " tokens are too few for one sample of seq_len + 1 = ", seq_len_ + 1, " tokens");
  num_samples_ = (num_tokens_ - 1) / uint64_t(seq_len_);
}

void MegatronSource::lay_out(uint64_t epoch) {
  const auto& docs = data_->index().document_indices;
  const auto& lengths = data_->index().sequence_lengths;
  const uint64_t n = end_document_ - first_document_;
  std::vector<uint64_t> doc_order;
  if (shuffle_documents_) {
    doc_order = seeded_permutation(n, seed_, ShuffleStream::documents, epoch);
  } else {
    doc_order.resize(n);
    for (uint64_t i = 0; i < n; ++i) doc_order[i] = i;
  }
  sequence_order_.clear();
  sequence_starts_.assign(1, 0);
  for (const uint64_t d : doc_order) {
    // A document's sequences stay together and in order.
    for (int64_t s = docs[first_document_ + d]; s < docs[first_document_ + d + 1]; ++s) {
      sequence_order_.push_back(uint64_t(s));
      sequence_starts_.push_back(sequence_starts_.back() + uint64_t(lengths[s]));
    }
  }
  laid_out_epoch_ = epoch;
  laid_out_ = true;
}

void MegatronSource::read_sample(uint64_t epoch, uint64_t index, int32_t* out) {
  FSDP_ASSERT(index < num_samples_, "sample ", index, " of ", num_samples_);
  if (!laid_out_ || laid_out_epoch_ != epoch) lay_out(epoch);
  uint64_t pos = index * uint64_t(seq_len_);
  uint64_t left = uint64_t(seq_len_) + 1;
  std::size_t k = std::upper_bound(sequence_starts_.begin(), sequence_starts_.end(), pos) -
                  sequence_starts_.begin() - 1;
  while (left > 0) {
    FSDP_ASSERT(k < sequence_order_.size(), "sample ", index, " runs past the epoch");
    const TokenArray seq = data_->sequence(sequence_order_[k]);
    const uint64_t offset = pos - sequence_starts_[k];
    const uint64_t n = std::min(left, seq.count - offset);
    seq.copy_to(offset, n, out);
    out += n;
    pos += n;
    left -= n;
    ++k;
  }
}

std::string MegatronSource::describe() const {
  return str_cat("Megatron '", data_->prefix(), "': documents [", first_document_, ", ",
                 end_document_, ") of ", data_->num_documents(), ", ", num_tokens_, " tokens, ",
                 num_samples_, " samples of ", seq_len_, "+1 tokens",
                 shuffle_documents_ ? ", documents shuffled per epoch" : "");
}

}  // namespace fsdp::data
