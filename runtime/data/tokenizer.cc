#include "runtime/data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <array>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"
#include "runtime/data/files.h"
#include "runtime/data/pretokenizer.h"
#include "runtime/data/unicode.h"

namespace fsdp::data {
namespace {

// Words are short and repeat a lot; past this many distinct words the cache starts over,
// which bounds its memory on large corpora.
constexpr std::size_t kMaxCachedWords = 1 << 18;

// GPT-2's byte alphabet: bytes that are printable Latin-1 characters stand for themselves;
// the other 68 (controls, space, 0x7F..0xA0, 0xAD) map, in byte order, to U+0100, U+0101, ...
// so every byte has a visible one-character name in the vocabulary files.
class ByteAlphabet {
 public:
  ByteAlphabet() {
    byte_of_.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : 256 + next_extra++;
      byte_of_[cp] = b;
    }
  }

  // The raw bytes a vocabulary string spells; false if it uses a character outside the
  // alphabet or is not valid UTF-8.
  bool to_bytes(std::string_view name, std::string& bytes) const {
    bytes.clear();
    for (std::size_t pos = 0; pos < name.size();) {
      const Utf8Char ch = decode_utf8(name, pos);
      if (!ch.valid || ch.code_point >= byte_of_.size() || byte_of_[ch.code_point] < 0) {
        return false;
      }
      bytes.push_back(static_cast<char>(byte_of_[ch.code_point]));
      pos += ch.length;
    }
    return true;
  }

 private:
  std::array<int, 256 + 68> byte_of_;  // code point -> byte, -1 if none
};

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path) {
  const auto token_ids = load_vocab(vocab_path);
  load_merges(merges_path, token_ids);
}

std::unordered_map<std::string, int32_t> Gpt2Tokenizer::load_vocab(const std::string& path) {
  const std::string text = read_file(path);
  check_json_depth<DataError>(text, "vocabulary file '" + path + "'");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    FSDP_THROW(DataError, "vocabulary file '", path, "' is not valid JSON: ", e.what());
  }
  FSDP_CHECK(vocab.is_object() && !vocab.empty(), DataError, "vocabulary file '", path,
             "' must be a non-empty JSON object {\"token\": id, ...}");
  FSDP_CHECK(vocab.size() < static_cast<std::size_t>(std::numeric_limits<int32_t>::max()),
             DataError, "vocabulary file '", path, "' has too many entries");

  const ByteAlphabet alphabet;
  const std::size_t n = vocab.size();
  token_bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, int32_t> token_ids;
  token_ids.reserve(n);
  std::string bytes;
  for (const auto& [name, value] : vocab.items()) {
    FSDP_CHECK(value.is_number_integer(), DataError, "vocabulary file '", path, "': entry \"",
               name, "\" has a non-integer id");
    const int64_t id = value.get<int64_t>();
    FSDP_CHECK(id >= 0 && id < static_cast<int64_t>(n), DataError, "vocabulary file '", path,
               "': entry \"", name, "\" has id ", id, ", outside [0, ", n,
               ") (ids must be dense)");
    FSDP_CHECK(!seen[id], DataError, "vocabulary file '", path, "': id ", id,
               " is used twice (again by \"", name, "\")");
    FSDP_CHECK(alphabet.to_bytes(name, bytes), DataError, "vocabulary file '", path,
               "': entry \"", name, "\" (id ", id,
               ") uses a character outside GPT-2's byte alphabet");
    seen[id] = true;
    token_bytes_[id] = bytes;
    token_ids.emplace(bytes, static_cast<int32_t>(id));
  }

  for (int b = 0; b < 256; ++b) {
    const auto it = token_ids.find(std::string(1, static_cast<char>(b)));
    FSDP_CHECK(it != token_ids.end(), DataError, "vocabulary file '", path,
               "' has no token for byte ", b, " (a byte-level vocabulary needs all 256)");
    byte_tokens_[b] = it->second;
  }
  const auto eot = token_ids.find(std::string(kEndOfText));
  FSDP_CHECK(eot != token_ids.end(), DataError, "vocabulary file '", path, "' has no \"",
             kEndOfText, "\" token");
  eot_token_ = eot->second;
  return token_ids;
}

void Gpt2Tokenizer::load_merges(const std::string& path,
                                const std::unordered_map<std::string, int32_t>& token_ids) {
  const std::string text = read_file(path);
  const ByteAlphabet alphabet;
  std::string left_bytes, right_bytes;
  std::size_t line_start = 0;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (line_start < text.size()) {
    std::size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.substr(0, 8) == "#version")) continue;

    const std::size_t space = line.find(' ');
    const bool two_parts = space != std::string_view::npos && space > 0 &&
                           space + 1 < line.size() &&
                           line.find(' ', space + 1) == std::string_view::npos;
    FSDP_CHECK(two_parts, DataError, "merges file '", path, "' line ", line_number,
               ": expected two tokens separated by one space, got \"", line, "\"");
    const std::string_view left = line.substr(0, space);
    const std::string_view right = line.substr(space + 1);
    FSDP_CHECK(alphabet.to_bytes(left, left_bytes) && alphabet.to_bytes(right, right_bytes),
               DataError, "merges file '", path, "' line ", line_number,
               ": a character outside GPT-2's byte alphabet in \"", line, "\"");

    const auto l = token_ids.find(left_bytes);
    const auto r = token_ids.find(right_bytes);
    const auto merged = token_ids.find(left_bytes + right_bytes);
    FSDP_CHECK(l != token_ids.end() && r != token_ids.end() && merged != token_ids.end(),
               DataError, "merges file '", path, "' line ", line_number, ": \"", line,
               "\" names a token that is not in the vocabulary (", token_ids.size(),
               " entries)");
    // A repeated pair keeps its first (lowest) rank.
    merges_.emplace(pair_key(l->second, r->second), Merge{rank, merged->second});
    ++rank;
  }
  FSDP_CHECK(!merges_.empty(), DataError, "merges file '", path, "' has no merge rules");
}

void Gpt2Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) {
  const std::string key(word);
  if (const auto hit = word_cache_.find(key); hit != word_cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }

  std::vector<int32_t> parts;  // (n) token ids, one per byte to start with
  parts.reserve(word.size());
  for (const char c : word) parts.push_back(byte_tokens_[static_cast<unsigned char>(c)]);

  while (parts.size() > 1) {
    // The adjacent pair with the lowest rank...
    const Merge* best = nullptr;
    int32_t best_left = 0, best_right = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = merges_.find(pair_key(parts[i], parts[i + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_left = parts[i];
        best_right = parts[i + 1];
      }
    }
    if (best == nullptr) break;
    // ...is merged everywhere it occurs, left to right, in one pass.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i + 1 < parts.size() && parts[i] == best_left && parts[i + 1] == best_right) {
        parts[kept++] = best->result;
        ++i;
      } else {
        parts[kept++] = parts[i];
      }
    }
    parts.resize(kept);
  }

  out.insert(out.end(), parts.begin(), parts.end());
  if (word_cache_.size() >= kMaxCachedWords) word_cache_.clear();
  word_cache_.emplace(key, std::move(parts));
}

void Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) {
  for (const std::string_view word : split_gpt2_words(text)) encode_word(word, out);
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text, bool allow_special) {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 1);
  if (!allow_special) {
    encode_ordinary(text, ids);
    return ids;
  }
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t hit = text.find(kEndOfText, pos);
    if (hit == std::string_view::npos) {
      encode_ordinary(text.substr(pos), ids);
      break;
    }
    encode_ordinary(text.substr(pos, hit - pos), ids);
    ids.push_back(eot_token_);
    pos = hit + kEndOfText.size();
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(const int32_t* ids, std::size_t count) const {
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    FSDP_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), ValueError, "token id ", ids[i],
               " at position ", i, " is outside the vocabulary [0, ", vocab_size(), ")");
    text += token_bytes_[ids[i]];
  }
  return text;
}

}  // namespace fsdp::data
