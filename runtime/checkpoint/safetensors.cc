#include "runtime/checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernels/ops.h"

namespace fsdp::checkpoint {
namespace {

// The header must be JSON of a small, fixed shape; this parser reads exactly the subset it
// needs (objects, arrays, strings, non-negative integers) and rejects everything else with
// a message naming the byte offset.
struct Json {
  enum class Type { Object, Array, String, Integer, Other } type = Type::Other;
  std::vector<std::pair<std::string, Json>> members;  // Object, in file order
  std::vector<Json> items;                            // Array
  std::string text;                                   // String
  uint64_t integer = 0;                               // Integer
};

class HeaderParser {
 public:
  HeaderParser(const std::string& file, const std::string& text) : file_(file), s_(text) {}

  Json parse() {
    Json v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the header object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    FSDP_THROW(CheckpointError, file_, ": bad safetensors header at byte ", pos_, ": ", what);
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' ||
                                s_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= s_.size()) fail("unexpected end of the header");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  Json value(int depth) {
    if (depth > 8) fail("nesting too deep");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v;
      v.type = Json::Type::String;
      v.text = string();
      return v;
    }
    if (c >= '0' && c <= '9') return integer();
    if (c == '-') fail("negative number");
    fail("expected an object, array, string or non-negative integer");
  }

  Json object(int depth) {
    Json v;
    v.type = Json::Type::Object;
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    while (true) {
      if (peek() != '"') fail("expected a key string");
      std::string key = string();
      for (const auto& m : v.members)
        if (m.first == key) fail("duplicate key \"" + key + "\"");
      expect(':');
      v.members.emplace_back(std::move(key), value(depth + 1));
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Json array(int depth) {
    Json v;
    v.type = Json::Type::Array;
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      v.items.push_back(value(depth + 1));
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Json integer() {
    Json v;
    v.type = Json::Type::Integer;
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = uint64_t(s_[pos_] - '0');
      if (v.integer > (UINT64_MAX - digit) / 10) fail("integer too large");
      v.integer = v.integer * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && s_[start] == '0') fail("integer with a leading zero");
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      fail("non-integer number");
    return v;
  }

  // A JSON string; \uXXXX escapes are encoded as UTF-8 (surrogate pairs combined).
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate");
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape \\") + e);
      }
    }
  }
  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  const std::string& file_;
  const std::string& s_;
  size_t pos_ = 0;
};

// JSON string literal for `s` (the writer's side).
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The largest header we accept (the format's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

void seek(std::FILE* f, uint64_t offset, const std::string& path) {
  FSDP_CHECK(fseeko(f, off_t(offset), SEEK_SET) == 0, IoError, path, ": cannot seek to byte ",
             offset, ": ", std::strerror(errno));
}

}  // namespace

// ---------------------------------------------------------------- dtypes

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u16: return "U16";
    case DType::u8: return "U8";
  }
  return "?";
}

DType dtype_from_safetensors(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::i32,
                  DType::u16, DType::u8})
    if (name == safetensors_dtype_name(t)) return t;
  FSDP_THROW(CheckpointError, "unknown safetensors dtype \"", name,
             "\" (known: F32, BF16, F16, F64, I64, I32, U16, U8)");
}

// ---------------------------------------------------------------- reader

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rb");
  FSDP_CHECK(file_ != nullptr, IoError, path, ": cannot open: ", std::strerror(errno));
  try {
    FSDP_CHECK(fseeko(file_, 0, SEEK_END) == 0, IoError, path, ": cannot seek");
    const uint64_t file_size = uint64_t(ftello(file_));
    FSDP_CHECK(file_size >= 8, CheckpointError, path, ": truncated: ", file_size,
               " bytes, less than the 8-byte header length");
    seek(file_, 0, path);
    unsigned char len_bytes[8];
    FSDP_CHECK(std::fread(len_bytes, 1, 8, file_) == 8, IoError, path, ": cannot read");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    FSDP_CHECK(header_len <= kMaxHeaderBytes, CheckpointError, path, ": header length ",
               header_len, " is over the ", kMaxHeaderBytes, "-byte limit (not a safetensors file?)");
    FSDP_CHECK(8 + header_len <= file_size, CheckpointError, path, ": truncated: the header needs ",
               header_len, " bytes but the file has ", file_size - 8, " after the length");
    std::string text(size_t(header_len), '\0');
    FSDP_CHECK(std::fread(&text[0], 1, text.size(), file_) == text.size(), IoError, path,
               ": cannot read the header");
    data_start_ = 8 + header_len;
    const uint64_t data_size = file_size - data_start_;

    const Json root = HeaderParser(path, text).parse();
    FSDP_CHECK(root.type == Json::Type::Object, CheckpointError, path,
               ": the header is not a JSON object");
    for (const auto& [name, v] : root.members) {
      if (name == "__metadata__") {
        FSDP_CHECK(v.type == Json::Type::Object, CheckpointError, path,
                   ": __metadata__ must be an object of strings");
        for (const auto& [k, mv] : v.members) {
          FSDP_CHECK(mv.type == Json::Type::String, CheckpointError, path, ": __metadata__ value \"",
                     k, "\" is not a string");
          metadata_[k] = mv.text;
        }
        continue;
      }
      FSDP_CHECK(v.type == Json::Type::Object, CheckpointError, path, ": tensor \"", name,
                 "\": entry is not an object");
      SafetensorsEntry e;
      e.name = name;
      bool has_dtype = false, has_shape = false, has_offsets = false;
      for (const auto& [key, f] : v.members) {
        if (key == "dtype") {
          FSDP_CHECK(f.type == Json::Type::String, CheckpointError, path, ": tensor \"", name,
                     "\": dtype is not a string");
          try {
            e.dtype = dtype_from_safetensors(f.text);
          } catch (const CheckpointError& err) {
            FSDP_THROW(CheckpointError, path, ": tensor \"", name, "\": ", err.what());
          }
          has_dtype = true;
        } else if (key == "shape") {
          FSDP_CHECK(f.type == Json::Type::Array, CheckpointError, path, ": tensor \"", name,
                     "\": shape is not an array");
          std::vector<int64_t> dims;
          for (const Json& d : f.items) {
            FSDP_CHECK(d.type == Json::Type::Integer && d.integer < (1ull << 48), CheckpointError,
                       path, ": tensor \"", name, "\": shape holds a non-integer or huge value");
            dims.push_back(int64_t(d.integer));
          }
          e.shape = Shape(dims);
          has_shape = true;
        } else if (key == "data_offsets") {
          FSDP_CHECK(f.type == Json::Type::Array && f.items.size() == 2 &&
                         f.items[0].type == Json::Type::Integer &&
                         f.items[1].type == Json::Type::Integer,
                     CheckpointError, path, ": tensor \"", name,
                     "\": data_offsets must be [begin, end]");
          e.begin = f.items[0].integer;
          e.end = f.items[1].integer;
          has_offsets = true;
        } else {
          FSDP_THROW(CheckpointError, path, ": tensor \"", name, "\": unknown field \"", key, "\"");
        }
      }
      FSDP_CHECK(has_dtype && has_shape && has_offsets, CheckpointError, path, ": tensor \"", name,
                 "\": needs dtype, shape and data_offsets");
      FSDP_CHECK(e.begin <= e.end, CheckpointError, path, ": tensor \"", name, "\": data_offsets [",
                 e.begin, ", ", e.end, "] run backwards");
      FSDP_CHECK(e.end <= data_size, CheckpointError, path, ": tensor \"", name, "\": data_offsets [",
                 e.begin, ", ", e.end, "] are out of range: the data section has ", data_size,
                 " bytes (truncated file?)");
      const uint64_t expect = uint64_t(e.shape.numel()) * dtype_size(e.dtype);
      FSDP_CHECK(e.nbytes() == expect, CheckpointError, path, ": tensor \"", name, "\": ",
                 e.nbytes(), " bytes for ", safetensors_dtype_name(e.dtype), " ", e.shape,
                 ", which needs ", expect);
      entries_.push_back(std::move(e));
    }
    // The ranges must tile the data section exactly: no overlap, no hole, nothing after.
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                       return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
                     });
    uint64_t covered = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const SafetensorsEntry& e = entries_[i];
      FSDP_CHECK(e.begin >= covered, CheckpointError, path, ": tensor \"", e.name,
                 "\": bytes [", e.begin, ", ", e.end, ") overlap tensor \"", entries_[i - 1].name,
                 "\" (which ends at ", covered, ")");
      FSDP_CHECK(e.begin == covered, CheckpointError, path, ": tensor \"", e.name,
                 "\": a hole of ", e.begin - covered, " bytes before it in the data section");
      covered = e.end;
      index_[e.name] = i;
    }
    FSDP_CHECK(covered == data_size, CheckpointError, path, ": ", data_size - covered,
               " bytes after the last tensor are described by no entry");
  } catch (...) {
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (file_) std::fclose(file_);
}

bool SafetensorsReader::contains(const std::string& name) const { return index_.count(name) > 0; }

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  FSDP_CHECK(it != index_.end(), CheckpointError, path_, ": no tensor \"", name, "\"");
  return entries_[it->second];
}

void SafetensorsReader::read_bytes(const std::string& name, uint64_t byte_offset, void* dst,
                                   uint64_t nbytes) {
  const SafetensorsEntry& e = entry(name);
  FSDP_CHECK(byte_offset <= e.nbytes() && nbytes <= e.nbytes() - byte_offset, IndexError, path_,
             ": tensor \"", name, "\": bytes [", byte_offset, ", ", byte_offset + nbytes,
             ") are outside its ", e.nbytes());
  if (nbytes == 0) return;
  seek(file_, data_start_ + e.begin + byte_offset, path_);
  const size_t got = std::fread(dst, 1, size_t(nbytes), file_);
  FSDP_CHECK(got == nbytes, IoError, path_, ": tensor \"", name, "\": read ", got, " of ", nbytes,
             " bytes");
}

Tensor SafetensorsReader::load(Context& ctx, const std::string& name, bool on_host) {
  const SafetensorsEntry& e = entry(name);
  Tensor host = ctx.empty_host(e.shape, e.dtype);
  read_bytes(name, 0, host.numel() ? host.data_ptr() : nullptr, e.nbytes());
  if (on_host || ctx.device().is_cpu()) return host;
  Tensor dev = ctx.empty(e.shape, e.dtype);
  copy_bytes(dev, host, ctx.stream());
  return dev;
}

// ---------------------------------------------------------------- writer

SafetensorsWriter::SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), metadata_(std::move(metadata)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void SafetensorsWriter::declare(const std::string& name, DType dtype, const Shape& shape) {
  FSDP_CHECK(file_ == nullptr && !finished_, ValueError, path_, ": declare(\"", name,
             "\") after writing started");
  FSDP_CHECK(!name.empty() && name != "__metadata__", ValueError, path_, ": bad tensor name \"",
             name, "\"");
  for (const SafetensorsEntry& e : entries_)
    FSDP_CHECK(e.name != name, ValueError, path_, ": tensor \"", name, "\" declared twice");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = shape;
  e.begin = entries_.empty() ? 0 : entries_.back().end;
  e.end = e.begin + uint64_t(shape.numel()) * dtype_size(dtype);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::begin_data() {
  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata_) {
      if (!first) header += ",";
      header += quote(k) + ":" + quote(v);
      first = false;
    }
    header += "}";
    first = false;
  }
  for (const SafetensorsEntry& e : entries_) {
    if (!first) header += ",";
    first = false;
    header += quote(e.name) + ":{\"dtype\":\"" + safetensors_dtype_name(e.dtype) + "\",\"shape\":[";
    for (int64_t d = 0; d < e.shape.rank(); ++d)
      header += (d ? "," : "") + std::to_string(e.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  header += "}";
  // Spaces pad the header so the data section starts 8-byte aligned (as the reference
  // implementation does).
  while (header.size() % 8) header += ' ';

  file_ = std::fopen(tmp_path_.c_str(), "wb");
  FSDP_CHECK(file_ != nullptr, IoError, tmp_path_, ": cannot create: ", std::strerror(errno));
  unsigned char len_bytes[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  FSDP_CHECK(std::fwrite(len_bytes, 1, 8, file_) == 8 &&
                 std::fwrite(header.data(), 1, header.size(), file_) == header.size(),
             IoError, tmp_path_, ": write failed: ", std::strerror(errno));
  // Skip tensors of zero bytes.
  while (next_ < entries_.size() && entries_[next_].nbytes() == 0) ++next_;
}

void SafetensorsWriter::write(const std::string& name, const void* data, uint64_t nbytes) {
  FSDP_CHECK(!finished_, ValueError, path_, ": write(\"", name, "\") after finish()");
  if (!file_) begin_data();
  if (nbytes == 0) return;
  FSDP_CHECK(next_ < entries_.size(), ValueError, path_, ": write(\"", name,
             "\"): every declared tensor is already written");
  const SafetensorsEntry& e = entries_[next_];
  FSDP_CHECK(e.name == name, ValueError, path_, ": write(\"", name, "\"): expected \"", e.name,
             "\" next (tensors are written in declaration order)");
  FSDP_CHECK(written_ + nbytes <= e.nbytes(), ValueError, path_, ": tensor \"", name, "\": ",
             written_ + nbytes, " bytes written for a tensor of ", e.nbytes());
  FSDP_CHECK(std::fwrite(data, 1, size_t(nbytes), file_) == nbytes, IoError, tmp_path_,
             ": write failed: ", std::strerror(errno));
  written_ += nbytes;
  if (written_ == e.nbytes()) {
    written_ = 0;
    ++next_;
    while (next_ < entries_.size() && entries_[next_].nbytes() == 0) ++next_;
  }
}

void SafetensorsWriter::finish() {
  FSDP_CHECK(!finished_, ValueError, path_, ": finish() called twice");
  if (!file_) begin_data();
  FSDP_CHECK(next_ == entries_.size(), ValueError, path_, ": finish() before tensor \"",
             entries_[next_].name, "\" was fully written");
  const bool ok = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    std::remove(tmp_path_.c_str());
    FSDP_THROW(IoError, tmp_path_, ": write failed: ", std::strerror(errno));
  }
  FSDP_CHECK(std::rename(tmp_path_.c_str(), path_.c_str()) == 0, IoError, path_,
             ": cannot rename from ", tmp_path_, ": ", std::strerror(errno));
  finished_ = true;
}

void save_safetensors(Context& ctx, const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, metadata);
  for (const auto& [name, t] : tensors) {
    check_defined(t, name.c_str());
    w.declare(name, t.dtype(), t.shape());
  }
  for (const auto& [name, t] : tensors) {
    const Tensor host = ops::contiguous(ctx, ops::to_host(ctx, t));
    w.write(name, host.numel() ? host.data_ptr() : nullptr, host.nbytes());
  }
  w.finish();
}

}  // namespace fsdp::checkpoint
