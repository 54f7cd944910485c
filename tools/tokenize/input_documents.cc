#include "tools/tokenize/input_documents.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"
#include "runtime/core/thread_pool.h"
#include "runtime/data/files.h"
#include "runtime/data/text_documents.h"

namespace fsdp::tokenize {
namespace {

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// Inflates every gzip member of `compressed` in turn (gzip -c a b > ab.gz makes two).
std::string gunzip(const std::string& compressed, const std::string& path) {
  FSDP_CHECK(compressed.size() <= 0xFFFFFFFFu, DataError, path,
             ": gzip files over 4 GiB are not supported; split the input");
  std::string out;
  z_stream z{};
  // 16 + MAX_WBITS: a gzip header and trailer (CRC and length, which inflate checks).
  FSDP_CHECK(inflateInit2(&z, 16 + MAX_WBITS) == Z_OK, DataError, path,
             ": cannot start gzip decompression");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&z, inflateEnd);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  z.avail_in = static_cast<uInt>(compressed.size());
  std::string chunk(1 << 20, '\0');
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(chunk.data());
    z.avail_out = static_cast<uInt>(chunk.size());
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.append(chunk.data(), chunk.size() - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) return out;
      FSDP_CHECK(inflateReset(&z) == Z_OK, DataError, path, ": cannot read the next gzip member");
      continue;
    }
    // Z_BUF_ERROR: no progress possible, i.e. the input ended inside a member.
    FSDP_CHECK(rc != Z_BUF_ERROR, DataError, path, ": truncated gzip data (it ends inside a "
               "compressed member, after ", out.size(), " decompressed bytes)");
    FSDP_CHECK(rc == Z_OK, DataError, path, ": corrupt gzip data near compressed byte offset ",
               compressed.size() - z.avail_in, z.msg ? std::string(" (") + z.msg + ")" : "");
  }
}

std::string where(const std::string& path, size_t line, size_t offset) {
  return path + " line " + std::to_string(line) + " (byte offset " + std::to_string(offset) + ")";
}

}  // namespace

void Documents::add(std::string text) {
  sentences.push_back(std::move(text));
  first_sentence.push_back(sentences.size());
}

void Documents::add(std::vector<std::string> doc_sentences) {
  for (std::string& sentence : doc_sentences) sentences.push_back(std::move(sentence));
  first_sentence.push_back(sentences.size());
}

void Documents::append(Documents&& other) {
  const size_t offset = sentences.size();
  for (std::string& sentence : other.sentences) sentences.push_back(std::move(sentence));
  for (size_t d = 1; d < other.first_sentence.size(); ++d)
    first_sentence.push_back(offset + other.first_sentence[d]);
}

std::string read_input_bytes(const std::string& path) {
  std::string bytes = data::read_file(path);
  return is_gzip(bytes) ? gunzip(bytes, path) : bytes;
}

Documents json_lines_documents(const std::string& bytes, const std::string& key,
                               const std::string& path) {
  Documents docs;
  size_t begin = 0;
  for (size_t line = 1; begin < bytes.size(); ++line) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    const std::string_view text(bytes.data() + begin, end - begin);
    const size_t offset = begin;
    begin = end + 1;
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
    FSDP_CHECK(!json_too_deep(text), DataError, where(path, line, offset),
               ": JSON nested deeper than ", kMaxJsonDepth, " levels");
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {  // a parse error, or a number out of range
      FSDP_THROW(DataError, where(path, line, offset), ": not valid JSON: ", e.what());
    }
    FSDP_CHECK(object.is_object(), DataError, where(path, line, offset),
               ": expected a JSON object, got ", object.type_name());
    const auto member = object.find(key);
    FSDP_CHECK(member != object.end(), DataError, where(path, line, offset), ": no member \"",
               key, "\" (see --json-key)");
    if (member->is_string()) {
      docs.add(member->get<std::string>());
      continue;
    }
    FSDP_CHECK(member->is_array(), DataError, where(path, line, offset), ": member \"", key,
               "\" is a ", member->type_name(), ", not a string or a list of strings");
    std::vector<std::string> sentences;
    for (size_t i = 0; i < member->size(); ++i) {
      const nlohmann::json& sentence = (*member)[i];
      FSDP_CHECK(sentence.is_string(), DataError, where(path, line, offset), ": element ", i,
                 " of member \"", key, "\" is a ", sentence.type_name(),
                 ", not a string (a list holds a document's sentences)");
      sentences.push_back(sentence.get<std::string>());
    }
    docs.add(std::move(sentences));
  }
  return docs;
}

Documents read_input_documents(const std::string& path, const InputFormat& format) {
  std::string bytes = read_input_bytes(path);
  if (!format.json_key.empty()) return json_lines_documents(bytes, format.json_key, path);
  std::vector<std::string> texts;
  data::append_text_documents(std::move(bytes), format.split_blank_lines, texts);
  Documents docs;
  for (std::string& text : texts) docs.add(std::move(text));
  return docs;
}

Documents read_all_documents(const std::vector<std::string>& paths, const InputFormat& format,
                             unsigned workers) {
  std::vector<Documents> per_file(paths.size());
  ThreadPool pool(std::max(1u, std::min<unsigned>(workers, unsigned(paths.size()))));
  pool.parallel_for(int64_t(paths.size()), [&](int64_t i) {
    per_file[size_t(i)] = read_input_documents(paths[size_t(i)], format);
  });
  Documents docs;
  for (Documents& file_docs : per_file) docs.append(std::move(file_docs));
  return docs;
}

}  // namespace fsdp::tokenize
