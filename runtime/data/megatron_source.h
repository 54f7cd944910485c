// Samples from a Megatron indexed data set, the way Megatron-LM's GPT data set builds them:
// each epoch the documents are concatenated in a seeded shuffled order and the result is cut
// into samples of seq_len + 1 tokens, consecutive samples sharing one token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/megatron_indexed.h"
#include "runtime/data/sample_source.h"

namespace fsdp::data {

class MegatronSource : public SampleSource {
 public:
  // Uses documents [first_document, end_document) (a held-out split takes a range). With
  // shuffle_documents false the documents keep their file order in every epoch. DataError if
  // those documents hold fewer than T + 1 tokens, naming the data as `name` (empty: its
  // prefix and the documents used).
  MegatronSource(std::shared_ptr<const MegatronDataset> data, int64_t seq_len, uint64_t seed,
                 bool shuffle_documents, uint64_t first_document, uint64_t end_document,
                 std::string name = "");

  int64_t seq_len() const override { return seq_len_; }
  uint64_t num_samples() const override { return num_samples_; }
  void read_sample(uint64_t epoch, uint64_t index, int32_t* out) override;
  void check_vocab(int64_t vocab_size) const override { data_->check_vocab(vocab_size); }
  std::string describe() const override;

 private:
  // Lays out epoch `epoch`: its sequence order and where each starts in the concatenation.
  void lay_out(uint64_t epoch);

  std::shared_ptr<const MegatronDataset> data_;
  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_documents_;
  uint64_t first_document_, end_document_;
  std::string name_;
  uint64_t num_tokens_ = 0;  // in the documents used
  uint64_t num_samples_ = 0;

  uint64_t laid_out_epoch_ = 0;
  bool laid_out_ = false;
  std::vector<uint64_t> sequence_order_;   // (sequences used) in concatenation order
  std::vector<uint64_t> sequence_starts_;  // (sequences used + 1) token offsets, then total
};

}  // namespace fsdp::data
