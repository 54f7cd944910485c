// A Megatron-LM .idx file: magic, version, dtype, sequence and document counts, and the
// arrays they size, against the file's length.
// Property: accepted document indices run from 0 to the sequence count without going back,
// and each sequence starts where the one before it ends (lengths times the dtype's size).
#include "runtime/core/error.h"
#include "runtime/data/megatron_indexed.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp;
  static fuzz::ScratchFile file(".idx");
  const std::string& path = file.write(fuzz::bytes_of(data, size));
  try {
    const data::MegatronIndex index = data::read_megatron_index(path);
    const auto& docs = index.document_indices;
    if (docs.empty() || docs.front() != 0 || uint64_t(docs.back()) != index.num_sequences())
      fuzz::property_failed("document indices do not run from 0 to the sequence count");
    for (size_t i = 1; i < docs.size(); ++i)
      if (docs[i] < docs[i - 1]) fuzz::property_failed("document indices go back");
    if (index.sequence_pointers.size() != index.sequence_lengths.size())
      fuzz::property_failed("a sequence without its pointer");
    for (int32_t length : index.sequence_lengths)
      if (length < 0) fuzz::property_failed("a negative sequence length");
    uint64_t end = 0;
    for (size_t i = 0; i < index.num_sequences(); ++i) {
      if (index.sequence_pointers[i] < 0 || uint64_t(index.sequence_pointers[i]) != end)
        fuzz::property_failed("a sequence does not start where the one before it ends");
      end += uint64_t(index.sequence_lengths[i]) * data::token_type_size(index.token_type);
    }
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
