#include "runtime/data/megatron_indexed.h"

#include <cstring>
#include <limits>
#include <string>

#include "runtime/core/error.h"

namespace fsdp::data {
namespace {

constexpr uint64_t kMegatronVersion = 1;

// Megatron's dtype codes (its DType enum): 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
// 6 float64, 7 float32, 8 uint16. Every integer one is a token type we read.
bool token_type_from_code(uint8_t code, TokenType& type) {
  switch (code) {
    case 1: type = TokenType::u8; return true;
    case 2: type = TokenType::i8; return true;
    case 3: type = TokenType::i16; return true;
    case 4: type = TokenType::i32; return true;
    case 5: type = TokenType::i64; return true;
    case 8: type = TokenType::u16; return true;
    default: return false;
  }
}

// Why a dtype code holds no tokens, for the error message.
std::string refused_code(uint8_t code) {
  if (code == 6 || code == 7)
    return str_cat("dtype code ", int(code), " is ", code == 6 ? "float64" : "float32",
                   ", which holds no tokens");
  return str_cat("dtype code ", int(code), " is not one of Megatron's");
}

// The bytes per token that `bytes` holding `tokens` tokens imply, when that is a width of
// Megatron's token dtypes (1, 2, 4 or 8) other than `item`; 0 otherwise. A dtype code other
// than the one the data was written with shows this way.
uint64_t other_width(uint64_t bytes, uint64_t tokens, uint64_t item) {
  if (tokens == 0 || bytes % tokens != 0) return 0;
  const uint64_t width = bytes / tokens;
  const bool token_width = width == 1 || width == 2 || width == 4 || width == 8;
  return token_width && width != item ? width : 0;
}

// The message's ending for a width other_width() found (empty for 0).
std::string width_hint(uint64_t width, TokenType type) {
  if (width == 0) return "";
  return str_cat(": that is ", width, " bytes per token, not the ", token_type_size(type), " of ",
                 token_type_name(type), ", so the data was probably written with another dtype "
                 "(Megatron writes uint16, code 8, for vocabularies under 65500 tokens, else "
                 "int32, code 4)");
}

uint8_t code_of(TokenType type) {
  switch (type) {
    case TokenType::u8: return 1;
    case TokenType::i8: return 2;
    case TokenType::i16: return 3;
    case TokenType::i32: return 4;
    case TokenType::i64: return 5;
    case TokenType::u16: return 8;
    case TokenType::u32: break;
  }
  FSDP_THROW(ValueError, "Megatron indexed data sets cannot store ", token_type_name(type),
             " tokens");
}

// Smallest and largest token a type can hold.
void type_range(TokenType type, int64_t& lo, int64_t& hi) {
  switch (type) {
    case TokenType::u8: lo = 0; hi = 255; return;
    case TokenType::i8: lo = -128; hi = 127; return;
    case TokenType::i16: lo = -32768; hi = 32767; return;
    case TokenType::u16: lo = 0; hi = 65535; return;
    default: lo = std::numeric_limits<int32_t>::min(); hi = std::numeric_limits<int32_t>::max();
  }
}

}  // namespace

MegatronIndex read_megatron_index(const std::string& path) {
  const MappedFile file(path);
  const unsigned char* p = file.data();
  const uint64_t size = file.size();
  FSDP_CHECK(size >= kMegatronHeaderBytes, DataError, "'", path,
             "': truncated Megatron index at byte offset ", size, ": the header needs ",
             kMegatronHeaderBytes, " bytes");
  FSDP_CHECK(std::memcmp(p, kMegatronMagic, kMegatronMagicBytes) == 0, DataError, "'", path,
             "' byte offset 0: bad magic, expected \"MMIDIDX\\0\\0\" (not a Megatron .idx file)");
  const uint64_t version = load_le<uint64_t>(p + 9);
  FSDP_CHECK(version == kMegatronVersion, DataError, "'", path,
             "' byte offset 9: unsupported Megatron index version ", version, " (expected 1)");
  MegatronIndex index;
  const uint8_t code = p[17];
  FSDP_CHECK(token_type_from_code(code, index.token_type), DataError, "'", path,
             "' byte offset 17: ", refused_code(code),
             " (token dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)");
  const uint64_t num_seqs = load_le<uint64_t>(p + 18);
  const uint64_t num_doc_indices = load_le<uint64_t>(p + 26);

  // Sizes from the header, checked against the file before anything is multiplied.
  const uint64_t body = size - kMegatronHeaderBytes;
  FSDP_CHECK(num_seqs <= body / 12 && num_doc_indices <= body / 8, DataError, "'", path,
             "': truncated at byte offset ", size, ": the header (byte offsets 18, 26) promises ",
             num_seqs, " sequences and ", num_doc_indices, " document indices");
  const uint64_t lengths_at = kMegatronHeaderBytes;
  const uint64_t pointers_at = lengths_at + 4 * num_seqs;
  const uint64_t docs_at = pointers_at + 8 * num_seqs;
  const uint64_t end = docs_at + 8 * num_doc_indices;
  FSDP_CHECK(size >= end, DataError, "'", path, "': truncated at byte offset ", size,
             ": the header (byte offsets 18, 26) promises ", num_seqs, " sequences and ",
             num_doc_indices, " document indices, which end at byte ", end);
  FSDP_CHECK(size == end || size == end + num_seqs, DataError, "'", path, "': ", size - end,
             " unexpected bytes from byte offset ", end, " after the arrays the header announces");
  FSDP_CHECK(num_doc_indices >= 1, DataError, "'", path,
             "' byte offset 26: the document index array must hold at least the leading 0");

  index.sequence_lengths.resize(num_seqs);
  index.sequence_pointers.resize(num_seqs);
  index.document_indices.resize(num_doc_indices);
  // An index of no sequences is valid, and memcpy may not be given the null data() of an
  // empty vector even for zero bytes.
  if (num_seqs > 0) {
    std::memcpy(index.sequence_lengths.data(), p + lengths_at, 4 * num_seqs);
    std::memcpy(index.sequence_pointers.data(), p + pointers_at, 8 * num_seqs);
  }
  std::memcpy(index.document_indices.data(), p + docs_at, 8 * num_doc_indices);

  for (uint64_t i = 0; i < num_seqs; ++i) {
    FSDP_CHECK(index.sequence_lengths[i] >= 0, DataError, "'", path, "' byte offset ",
               lengths_at + 4 * i, ": sequence ", i, " has negative length ",
               index.sequence_lengths[i]);
  }
  // Megatron's writer puts the sequences back to back from byte 0 of the .bin file: each
  // pointer is the bytes of the sequences before it. A dtype code other than the one the
  // data was written with breaks this (1 on uint16 data halves every token, 8 on int32 data
  // reads the halves of each token as two), so it is caught here rather than trained on.
  const uint64_t item = token_type_size(index.token_type);
  uint64_t expected = 0;  // stays below 2^63 + 2^34: it grows only while pointers match
  for (uint64_t i = 0; i < num_seqs; ++i) {
    const int64_t pointer = index.sequence_pointers[i];
    FSDP_CHECK(pointer >= 0 && uint64_t(pointer) == expected, DataError, "'", path,
               "' byte offset ", pointers_at + 8 * i, ": sequence ", i, " starts at .bin byte ",
               pointer, ", but the sequences before it end at byte ", expected, " (",
               expected / item, " tokens of ", token_type_name(index.token_type),
               ", dtype code ", int(code), " at byte offset 17)",
               width_hint(other_width(uint64_t(pointer), expected / item, item),
                          index.token_type));
    expected += uint64_t(index.sequence_lengths[i]) * item;
  }
  const auto& docs = index.document_indices;
  for (uint64_t d = 0; d < num_doc_indices; ++d) {
    const bool ok = d == 0 ? docs[0] == 0 : docs[d] >= docs[d - 1];
    FSDP_CHECK(ok && docs[d] <= int64_t(num_seqs), DataError, "'", path, "' byte offset ",
               docs_at + 8 * d, ": document index ", d, " is ", docs[d],
               "; document indices must rise from 0 to the sequence count ", num_seqs);
  }
  FSDP_CHECK(docs.back() == int64_t(num_seqs), DataError, "'", path, "' byte offset ",
             docs_at + 8 * (num_doc_indices - 1), ": the last document index is ", docs.back(),
             ", expected the sequence count ", num_seqs);
  return index;
}

MegatronDataset::MegatronDataset(const std::string& prefix)
    : prefix_(prefix), index_(read_megatron_index(prefix + ".idx")) {
  const std::string bin_path = prefix + ".bin";
  bin_ = std::make_shared<const MappedFile>(bin_path);
  for (const int32_t length : index_.sequence_lengths) num_tokens_ += uint64_t(length);
  // The pointers are checked to run back to back from byte 0, so the sequences fill the
  // .bin file exactly when its size is the tokens' bytes.
  const uint64_t item = token_type_size(index_.token_type);
  const uint64_t expected = num_tokens_ * item;
  const uint64_t bin_size = bin_->size();
  // What the index says, for the messages: "12 tokens of uint16 (x.idx byte offset 17)".
  const std::string described =
      str_cat(num_tokens_, " tokens of ", token_type_name(index_.token_type), " (dtype code at ",
              prefix, ".idx byte offset 17)");
  const std::string hint = width_hint(other_width(bin_size, num_tokens_, item), index_.token_type);
  if (bin_size < expected) {
    uint64_t i = 0;  // the first sequence that does not fit
    while (uint64_t(index_.sequence_pointers[i]) + uint64_t(index_.sequence_lengths[i]) * item <=
           bin_size)
      ++i;
    const int64_t start = index_.sequence_pointers[i];
    FSDP_THROW(DataError, "'", bin_path, "': truncated at byte offset ", bin_size, ": sequence ",
               i, " (", prefix, ".idx byte offset ",
               kMegatronHeaderBytes + 4 * num_sequences() + 8 * i, ") spans bytes [", start, ", ",
               start + int64_t(index_.sequence_lengths[i] * item),
               "), and the index describes ", described, ", ", expected, " bytes", hint);
  }
  FSDP_CHECK(bin_size == expected, DataError, "'", bin_path, "': ", bin_size - expected,
             " unexpected bytes from byte offset ", expected, " after the ", described,
             " the index describes", hint);
}

TokenArray MegatronDataset::sequence(uint64_t i) const {
  FSDP_ASSERT(i < num_sequences(), "sequence ", i, " of ", num_sequences());
  TokenArray array;
  array.owner = bin_;
  array.bytes = bin_->data() + index_.sequence_pointers[i];
  array.count = uint64_t(index_.sequence_lengths[i]);
  array.type = index_.token_type;
  array.file = bin_->path();
  array.file_offset = uint64_t(index_.sequence_pointers[i]);
  return array;
}

void MegatronDataset::check_vocab(int64_t vocab_size) const {
  for (uint64_t i = 0; i < num_sequences(); ++i) sequence(i).check_vocab(vocab_size);
}

MegatronWriter::MegatronWriter(const std::string& prefix, TokenType token_type)
    : prefix_(prefix), bin_(prefix + ".bin") {
  code_of(token_type);  // refuses types Megatron cannot name
  index_.token_type = token_type;
  index_.document_indices.push_back(0);
}

void MegatronWriter::add_sequence(const int32_t* tokens, uint64_t count) {
  FSDP_CHECK(!finished_, ValueError, "'", prefix_, "': sequence added after finish()");
  FSDP_CHECK(count <= uint64_t(std::numeric_limits<int32_t>::max()), ValueError, "'", prefix_,
             "': a document of ", count, " tokens is longer than Megatron's int32 lengths allow");
  int64_t lo, hi;
  type_range(index_.token_type, lo, hi);
  const int item = token_type_size(index_.token_type);
  std::vector<unsigned char> bytes(count * item);
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t t = tokens[i];
    FSDP_CHECK(t >= lo && t <= hi, ValueError, "'", prefix_, "': token ", t, " at index ", i,
               " of document ", index_.num_documents(), " does not fit ",
               token_type_name(index_.token_type));
    // Little-endian: the low `item` bytes of the 64-bit value are the stored token.
    std::memcpy(bytes.data() + i * item, &t, item);
  }
  index_.sequence_pointers.push_back(static_cast<int64_t>(bin_.bytes_written()));
  index_.sequence_lengths.push_back(static_cast<int32_t>(count));
  bin_.write(bytes.data(), bytes.size());
}

void MegatronWriter::end_document() {
  FSDP_CHECK(!finished_, ValueError, "'", prefix_, "': document ended after finish()");
  index_.document_indices.push_back(static_cast<int64_t>(index_.num_sequences()));
}

void MegatronWriter::finish() {
  FSDP_CHECK(!finished_, ValueError, "'", prefix_, "': finish() called twice");
  FSDP_CHECK(index_.document_indices.back() == int64_t(index_.num_sequences()), ValueError, "'",
             prefix_, "': sequences added after the last end_document()");
  finished_ = true;
  bin_.close();
  FileWriter idx(prefix_ + ".idx");
  idx.write(kMegatronMagic, kMegatronMagicBytes);
  idx.write_value<uint64_t>(kMegatronVersion);
  idx.write_value<uint8_t>(code_of(index_.token_type));
  idx.write_value<uint64_t>(index_.num_sequences());
  idx.write_value<uint64_t>(index_.document_indices.size());
  idx.write(index_.sequence_lengths.data(), 4 * index_.num_sequences());
  idx.write(index_.sequence_pointers.data(), 8 * index_.num_sequences());
  idx.write(index_.document_indices.data(), 8 * index_.document_indices.size());
  idx.close();
}

}  // namespace fsdp::data
