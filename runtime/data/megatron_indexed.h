// Megatron-LM indexed data sets: PREFIX.bin holds the tokens of every sequence back to back;
// PREFIX.idx describes them (all little-endian, arrays unaligned from byte 34):
//   0   magic "MMIDIDX\0\0" (9 bytes)
//   9   uint64 version = 1
//   17  uint8  token dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//              7 float32, 8 uint16; the float codes are not token types and are refused;
//              Megatron's preprocess_data.py writes 8 below 65500 tokens of vocabulary, else 4)
//   18  uint64 S = number of sequences
//   26  uint64 D = length of the document index array (number of documents + 1)
//   34  int32  sequence_lengths[S]   tokens per sequence
//       int64  sequence_pointers[S]  byte offset of each sequence in .bin: the sequences lie
//                                    back to back from byte 0, each pointer the sum of the
//                                    lengths before it times the dtype's size
//       int64  document_indices[D]   document d = sequences [idx[d], idx[d+1]); idx[0] = 0
//       (int8  sequence_modes[S], only in multimodal sets; ignored)
// D counts the entries of document_indices, as Megatron-LM's writer and reader do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/files.h"
#include "runtime/data/token_array.h"

namespace fsdp::data {

inline constexpr char kMegatronMagic[] = "MMIDIDX\0\0";  // 9 bytes with the two NULs
inline constexpr uint64_t kMegatronMagicBytes = 9;
inline constexpr uint64_t kMegatronHeaderBytes = 34;

struct MegatronIndex {
  TokenType token_type = TokenType::u16;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_pointers;
  std::vector<int64_t> document_indices;

  uint64_t num_sequences() const { return sequence_lengths.size(); }
  uint64_t num_documents() const { return document_indices.size() - 1; }
};

// Reads and checks PREFIX.idx: DataError naming the file and byte offset for a wrong magic,
// version or dtype (a float dtype is named), a truncated file, negative lengths, a pointer
// that is not the running sum of the lengths before it times the dtype's size (as when the
// dtype code is not the one the data was written with), or document indices that are not
// 0 = idx[0] <= idx[1] <= ... <= idx[D-1] = S.
MegatronIndex read_megatron_index(const std::string& idx_path);

// A Megatron data set opened for reading: the index in memory, the .bin file mapped.
class MegatronDataset {
 public:
  // `prefix` without ".bin"/".idx". Also checks that the .bin file holds exactly the
  // sequences' tokens: DataError naming it and the offset where it is short or too long
  // (and the bytes per token its size implies, when that is not the index's dtype).
  explicit MegatronDataset(const std::string& prefix);

  const MegatronIndex& index() const { return index_; }
  const std::string& prefix() const { return prefix_; }
  uint64_t num_sequences() const { return index_.num_sequences(); }
  uint64_t num_documents() const { return index_.num_documents(); }
  uint64_t num_tokens() const { return num_tokens_; }
  TokenArray sequence(uint64_t i) const;
  // DataError naming the .bin file and byte offset of the first out-of-vocabulary token.
  void check_vocab(int64_t vocab_size) const;

 private:
  std::string prefix_;
  MegatronIndex index_;
  std::shared_ptr<const MappedFile> bin_;
  uint64_t num_tokens_ = 0;
};

// Writes PREFIX.bin while sequences are added, then PREFIX.idx at finish(). A document is the
// sequences added since the previous end_document(), none or several (Megatron's
// preprocess_data.py writes one sequence per sentence of a pre-split document, and keeps an
// empty document as a document of no sequences).
class MegatronWriter {
 public:
  explicit MegatronWriter(const std::string& prefix, TokenType token_type = TokenType::u16);

  // Appends a sequence to the current document. ValueError if a token does not fit the
  // token type.
  void add_sequence(const int32_t* tokens, uint64_t count);
  void end_document();
  // A document of one sequence.
  void add_document(const int32_t* tokens, uint64_t count) {
    add_sequence(tokens, count);
    end_document();
  }
  void add_document(const std::vector<int32_t>& tokens) {
    add_document(tokens.data(), tokens.size());
  }
  // Writes the index; IoError on failure, ValueError if sequences were added after the last
  // end_document().
  void finish();

 private:
  std::string prefix_;
  FileWriter bin_;
  MegatronIndex index_;
  bool finished_ = false;
};

}  // namespace fsdp::data
