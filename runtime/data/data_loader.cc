#include "runtime/data/data_loader.h"

#include "runtime/core/error.h"
#include "runtime/data/assets.h"
#include "runtime/data/files.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/data/megatron_source.h"
#include "runtime/data/shuffle.h"
#include "runtime/data/text_documents.h"

namespace fsdp::data {
namespace {

// How messages name the data a spec opens: its label, `what` it is, and for a split the part
// used, in `unit`s ("tokens", "documents") of the whole.
std::string name_of(const DataSpec& spec, const std::string& what, const char* unit,
                    uint64_t begin, uint64_t end, uint64_t total) {
  std::string name = spec.label.empty() ? what : str_cat(spec.label, " of ", what);
  if (spec.split != DataSplit::all)
    name += str_cat(" (", unit, " [", begin, ", ", end, ") of ", total, ")");
  return name;
}

std::unique_ptr<SampleSource> open_llmc(const DataSpec& spec, int64_t seq_len) {
  std::vector<TokenArray> shards;
  for (const std::string& path : expand_glob(spec.path)) shards.push_back(open_llmc_shard(path));
  uint64_t total = 0;
  for (const TokenArray& shard : shards) total += shard.count;
  uint64_t begin, end;
  split_range(total, spec.split, spec.holdout_fraction, begin, end);
  const std::string what = str_cat("llm.c shards '", spec.path, "'");
  return std::make_unique<TokenStreamSource>(std::move(shards), seq_len, begin, end,
                                             name_of(spec, what, "tokens", begin, end, total));
}

std::unique_ptr<SampleSource> open_text(const DataSpec& spec, int64_t seq_len) {
  Gpt2Tokenizer tokenizer(
      locate_asset(spec.vocab_file.empty() ? kGpt2VocabAsset : spec.vocab_file),
      locate_asset(spec.merges_file.empty() ? kGpt2MergesAsset : spec.merges_file));
  const std::vector<std::string> files = expand_glob(spec.path);
  const std::string what = str_cat("text '", spec.path, "', tokenized in memory");
  std::vector<TokenArray> stream;
  stream.push_back(tokens_in_memory(
      tokenize_documents(tokenizer, read_text_documents(files, /*split_on_blank_lines=*/false)),
      what));
  const uint64_t total = stream[0].count;
  uint64_t begin, end;
  split_range(total, spec.split, spec.holdout_fraction, begin, end);
  return std::make_unique<TokenStreamSource>(std::move(stream), seq_len, begin, end,
                                             name_of(spec, what, "tokens", begin, end, total));
}

std::unique_ptr<SampleSource> open_megatron(const DataSpec& spec, int64_t seq_len,
                                            uint64_t seed) {
  auto data = std::make_shared<const MegatronDataset>(spec.path);
  const uint64_t total = data->num_documents();
  uint64_t begin, end;
  split_range(total, spec.split, spec.holdout_fraction, begin, end);
  const std::string what = str_cat("Megatron data set '", spec.path, "'");
  return std::make_unique<MegatronSource>(std::move(data), seq_len, seed, spec.shuffle, begin,
                                          end,
                                          name_of(spec, what, "documents", begin, end, total));
}

}  // namespace

DataFormat parse_data_format(const std::string& name) {
  if (name == "text") return DataFormat::text;
  if (name == "llmc") return DataFormat::llmc;
  if (name == "megatron") return DataFormat::megatron;
  FSDP_THROW(ConfigError, "unknown data format '", name, "' (expected text, llmc or megatron)");
}

const char* data_format_name(DataFormat format) {
  switch (format) {
    case DataFormat::text: return "text";
    case DataFormat::llmc: return "llmc";
    case DataFormat::megatron: return "megatron";
  }
  return "unknown";
}

std::unique_ptr<SampleSource> open_sample_source(const DataSpec& spec, int64_t seq_len,
                                                 uint64_t seed) {
  FSDP_CHECK(seq_len >= 1, ValueError, "sequence length must be at least 1, got ", seq_len);
  switch (spec.format) {
    case DataFormat::llmc: return open_llmc(spec, seq_len);
    case DataFormat::text: return open_text(spec, seq_len);
    case DataFormat::megatron: return open_megatron(spec, seq_len, seed);
  }
  FSDP_THROW(ConfigError, "unknown data format ", static_cast<int>(spec.format));
}

DataLoader::DataLoader(const DataSpec& spec, int64_t micro_batch_size, int64_t seq_len,
                       int dp_rank, int dp_size, uint64_t seed)
    : DataLoader(open_sample_source(spec, seq_len, seed), micro_batch_size, dp_rank, dp_size,
                 seed, spec.shuffle) {}

DataLoader::DataLoader(std::unique_ptr<SampleSource> source, int64_t micro_batch_size,
                       int dp_rank, int dp_size, uint64_t seed, bool shuffle_samples)
    : source_(std::move(source)), micro_batch_size_(micro_batch_size), dp_rank_(dp_rank),
      dp_size_(dp_size), seed_(seed), shuffle_samples_(shuffle_samples),
      next_sample_(uint64_t(dp_rank) * uint64_t(micro_batch_size)) {
  FSDP_CHECK(source_ != nullptr, ValueError, "DataLoader needs a sample source");
  FSDP_CHECK(micro_batch_size_ >= 1, ValueError, "micro-batch size must be at least 1, got ",
             micro_batch_size_);
  FSDP_CHECK(dp_size_ >= 1 && dp_rank_ >= 0 && dp_rank_ < dp_size_, ValueError,
             "data-parallel rank ", dp_rank_, " is not in [0, ", dp_size_, ")");
  sample_.resize(size_t(source_->seq_len()) + 1);
}

void DataLoader::seek(uint64_t global_samples) {
  next_sample_ = global_samples + uint64_t(dp_rank_) * uint64_t(micro_batch_size_);
}

DataLoader::SampleRef DataLoader::locate(uint64_t global_sample) {
  const uint64_t n = source_->num_samples();
  SampleRef ref{global_sample / n, global_sample % n};
  if (shuffle_samples_) {
    if (order_.empty() || order_epoch_ != ref.epoch) {
      order_ = seeded_permutation(n, seed_, ShuffleStream::samples, ref.epoch);
      order_epoch_ = ref.epoch;
    }
    ref.index = order_[ref.index];
  }
  return ref;
}

std::vector<DataLoader::SampleRef> DataLoader::sample_refs(uint64_t first, uint64_t count) {
  std::vector<SampleRef> refs;
  refs.reserve(count);
  for (uint64_t g = first; g < first + count; ++g) refs.push_back(locate(g));
  return refs;
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  const int64_t T = source_->seq_len();
  for (int64_t b = 0; b < micro_batch_size_; ++b) {
    const SampleRef ref = locate(next_sample_ + uint64_t(b));
    source_->read_sample(ref.epoch, ref.index, sample_.data());
    std::copy(sample_.begin(), sample_.begin() + T, inputs + b * T);       // tokens [0, T)
    std::copy(sample_.begin() + 1, sample_.begin() + T + 1, targets + b * T);  // [1, T]
  }
  next_sample_ += uint64_t(dp_size_) * uint64_t(micro_batch_size_);
}

std::string DataLoader::describe() const {
  return str_cat(source_->describe(), "; micro-batch ", micro_batch_size_, ", rank ", dp_rank_,
                 " of ", dp_size_, shuffle_samples_ ? ", samples shuffled per epoch" : ", samples in file order");
}

}  // namespace fsdp::data
