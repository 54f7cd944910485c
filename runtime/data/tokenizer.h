// GPT-2 byte-level byte-pair encoding (BPE), compatible with OpenAI's GPT-2 tokenizer.
//
// Text is cut into words (pretokenizer.h); each word's UTF-8 bytes start as one token per byte
// and adjacent pairs are merged, lowest merge rank first, until no ranked pair remains.
// The files are the usual pair:
//   vocabulary  encoder.json / vocab.json  {"token string": id, ...}; token strings spell bytes
//               in GPT-2's printable byte alphabet (byte b -> one code point, e.g. ' ' -> 'Ġ')
//   merges      vocab.bpe / merges.txt     "#version: ..." then one "left right" pair per line,
//               in rank order
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

class Gpt2Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  // Loads and cross-checks both files; a malformed file raises DataError naming the file and
  // the offending entry (line or key).
  Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path);

  // Token ids of `text` (any bytes; UTF-8 expected). With allow_special, each literal
  // "<|endoftext|>" becomes eot_token(); without it that string is encoded as ordinary text.
  // Not thread-safe: encoding fills a per-tokenizer cache of word encodings.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false);

  // The bytes the ids stand for, concatenated. decode(encode(s)) == s for every byte string.
  // The result is not valid UTF-8 if the ids cut a character in two. ValueError on an id
  // outside [0, vocab_size()).
  std::string decode(const int32_t* ids, std::size_t count) const;
  std::string decode(const std::vector<int32_t>& ids) const {
    return decode(ids.data(), ids.size());
  }

  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t eot_token() const { return eot_token_; }  // 50256 for GPT-2
  std::size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;    // position in the merges file; lower merges first
    int32_t result;  // id of the merged token
  };

  // Fill token_bytes_ and return the inverse map (bytes -> id) for load_merges.
  std::unordered_map<std::string, int32_t> load_vocab(const std::string& path);
  void load_merges(const std::string& path,
                   const std::unordered_map<std::string, int32_t>& token_ids);
  // BPE of one word's bytes, appended to out.
  void encode_word(std::string_view word, std::vector<int32_t>& out);
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out);

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  std::vector<std::string> token_bytes_;                   // id -> raw bytes
  int32_t byte_tokens_[256];                               // byte -> its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;             // (left, right) -> merge
  int32_t eot_token_ = -1;
  std::unordered_map<std::string, std::vector<int32_t>> word_cache_;
};

}  // namespace fsdp::data
