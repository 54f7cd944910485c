// tokenize's inputs (gzip, JSON lines) and its parallel encoder: the ids do not depend on
// the number of workers or on where large documents are cut.
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/files.h"
#include "runtime/data/text_documents.h"
#include "tests/data/test_files.h"
#include "tools/tokenize/input_documents.h"
#include "tools/tokenize/parallel_encode.h"
#include "tools/tokenize/progress.h"

using fsdp::testing::read_bytes;
using fsdp::testing::scratch_path;
using fsdp::testing::shipped_gpt2;
using fsdp::testing::write_bytes;
namespace tk = fsdp::tokenize;
using Tokens = std::vector<int32_t>;

namespace {

// Writes `text` as one gzip member (appended to the file when `append`).
void write_gzip(const std::string& path, const std::string& text, bool append = false) {
  gzFile f = gzopen(path.c_str(), append ? "ab" : "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), unsigned(text.size())) == int(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::string austen_prefix(size_t bytes) {
  const std::string text =
      fsdp::data::read_file(fsdp::data::locate_asset("third_party/text/austen.txt"));
  return text.substr(0, bytes);
}

// The message of the DataError `fn` throws.
template <typename Fn>
std::string data_error(Fn fn) {
  try {
    fn();
  } catch (const fsdp::DataError& e) {
    return e.what();
  }
  FAIL("expected a DataError");
  return "";
}

}  // namespace

TEST_CASE("gzip input decompresses to the original bytes, several members in turn",
          "[data][tools]") {
  const std::string text = austen_prefix(200000);
  const std::string one = scratch_path("one.txt.gz"), two = scratch_path("two.gz");
  write_gzip(one, text);
  write_gzip(two, text.substr(0, 1000));
  write_gzip(two, text.substr(1000), /*append=*/true);
  CHECK(tk::read_input_bytes(one) == text);
  CHECK(tk::read_input_bytes(two) == text);
  // Plain files pass through.
  const std::string plain = scratch_path("plain.txt");
  write_bytes(plain, text);
  CHECK(tk::read_input_bytes(plain) == text);
}

TEST_CASE("a truncated or corrupt gzip file is a DataError naming it", "[data][tools]") {
  const std::string good = scratch_path("good.gz");
  write_gzip(good, austen_prefix(50000));
  const std::string bytes = read_bytes(good);
  const std::string cut = scratch_path("cut.gz");
  write_bytes(cut, bytes.substr(0, bytes.size() / 2));
  const std::string message = data_error([&] { tk::read_input_bytes(cut); });
  CHECK_THAT(message, Catch::Contains(cut));
  CHECK_THAT(message, Catch::Contains("truncated"));
  std::string flipped = bytes;
  flipped[bytes.size() - 6] ^= 0x55;  // inside the trailer's CRC32 or length
  const std::string bad = scratch_path("bad.gz");
  write_bytes(bad, flipped);
  CHECK_THAT(data_error([&] { tk::read_input_bytes(bad); }), Catch::Contains(bad));
}

TEST_CASE("JSON lines: one document per line's member, errors name file, line and offset",
          "[data][tools]") {
  const std::string jsonl =
      "{\"text\": \"First doc\\nwith \\u00e9 and a tab\\t.\", \"id\": 1}\n"
      "\n"
      "{\"id\": 2, \"text\": \"Second.\"}\r\n"
      "{\"text\": \"\"}\n"
      "{\"text\": \"no newline at the end\"}";
  const tk::Documents docs = tk::json_lines_documents(jsonl, "text", "in.jsonl");
  // Each string is a document of one sentence; the empty one is kept, as Megatron keeps it.
  REQUIRE(docs.size() == 4);
  CHECK(docs.sentences == std::vector<std::string>{"First doc\nwith \xc3\xa9 and a tab\t.",
                                                   "Second.", "", "no newline at the end"});
  CHECK(docs.first_sentence == std::vector<size_t>{0, 1, 2, 3, 4});

  const std::string bad_json = "{\"text\": \"a\"}\n{\"text\": \"b\"\n";
  std::string m = data_error([&] { tk::json_lines_documents(bad_json, "text", "in.jsonl"); });
  CHECK_THAT(m, Catch::Contains("in.jsonl line 2 (byte offset 14)"));
  m = data_error([&] { tk::json_lines_documents("{\"body\": \"a\"}\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("f.jsonl line 1"));
  CHECK_THAT(m, Catch::Contains("no member \"text\""));
  m = data_error([&] { tk::json_lines_documents("{\"text\": 3}\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("not a string"));
  m = data_error([&] { tk::json_lines_documents("[\"text\"]\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("expected a JSON object"));
  // A number past a double's range is refused like any invalid JSON, naming the line.
  m = data_error([&] { tk::json_lines_documents("{\"text\": \"a\", \"n\": 1e99999}\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("f.jsonl line 1"));
  CHECK_THAT(m, Catch::Contains("not valid JSON"));
  // Nesting thousands of levels deep is refused before parsing, naming the line.
  const std::string deep = "{\"text\": \"a\"}\n{\"text\": \"b\", \"meta\": " +
                           std::string(10000, '[') + std::string(10000, ']') + "}\n";
  m = data_error([&] { tk::json_lines_documents(deep, "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("f.jsonl line 2") && Catch::Contains("nested deeper than 128"));
}

TEST_CASE("JSON lines: a list of strings is one document of pre-split sentences, as Megatron's",
          "[data][tools]") {
  const std::string jsonl =
      "{\"text\": [\"One.\", \" Two.\", \"\"]}\n"
      "{\"text\": []}\n"
      "{\"text\": \"Three.\"}\n";
  const tk::Documents docs = tk::json_lines_documents(jsonl, "text", "in.jsonl");
  REQUIRE(docs.size() == 3);
  CHECK(docs.sentences == std::vector<std::string>{"One.", " Two.", "", "Three."});
  CHECK(docs.first_sentence == std::vector<size_t>{0, 3, 3, 4});
  CHECK(docs.sentence_count(1) == 0);

  const std::string bad_element = "{\"text\": \"a\"}\n{\"text\": [\"b\", 7]}\n";
  std::string m = data_error([&] { tk::json_lines_documents(bad_element, "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("f.jsonl line 2 (byte offset 14)"));
  CHECK_THAT(m, Catch::Contains("element 1 of member \"text\" is a number, not a string"));
  m = data_error([&] { tk::json_lines_documents("{\"text\": [[\"a\"]]}\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("element 0"));
  m = data_error([&] { tk::json_lines_documents("{\"text\": {\"a\": 1}}\n", "text", "f.jsonl"); });
  CHECK_THAT(m, Catch::Contains("is a object, not a string or a list of strings"));
}

TEST_CASE("split_for_encoding: pieces encode to the whole text's ids", "[data][tools]") {
  const std::string text = austen_prefix(300000);
  const std::vector<std::string_view> pieces = tk::split_for_encoding(text, 3000);
  REQUIRE(pieces.size() > 50);
  std::string joined;
  Tokens piecewise;
  for (std::string_view p : pieces) {
    joined.append(p);
    const Tokens ids = shipped_gpt2().encode(p);
    piecewise.insert(piecewise.end(), ids.begin(), ids.end());
  }
  CHECK(joined == text);
  CHECK(piecewise == shipped_gpt2().encode(text));
  // Cuts only before a newline that follows a printable non-space character.
  for (size_t i = 1; i < pieces.size(); ++i) {
    CHECK(pieces[i].front() == '\n');
    const char before = pieces[i - 1].back();
    CHECK((before > ' ' && before < 0x7f));
  }
  // Text without such a point stays whole; short text is one piece.
  CHECK(tk::split_for_encoding(std::string(10000, ' ') + "\n\n", 100).size() == 1);
  CHECK(tk::split_for_encoding("short", 100).size() == 1);
  CHECK(tk::split_for_encoding("", 100).size() == 1);
}

TEST_CASE("encode_documents gives the same ids on 1 and on 4 workers", "[data][tools]") {
  std::vector<std::string> docs;
  fsdp::data::append_text_documents(austen_prefix(400000), /*split_on_blank_lines=*/true, docs);
  docs.push_back(austen_prefix(250000));  // one large document, cut into pieces
  tk::EncodeOptions one;
  one.workers = 1;
  one.progress = false;
  tk::EncodeOptions four = one;
  four.workers = 4;
  four.piece_bytes = 4096;
  const auto ids1 = tk::encode_documents(shipped_gpt2(), docs, one);
  const auto ids4 = tk::encode_documents(shipped_gpt2(), docs, four);
  REQUIRE(ids1.size() == docs.size());
  CHECK(ids1 == ids4);
  CHECK(ids1.back() == shipped_gpt2().encode(docs.back()));
  CHECK(ids1.front() == shipped_gpt2().encode(docs.front()));
}

TEST_CASE("the progress line: bytes, tokens/s and time left", "[data][tools]") {
  CHECK(tk::progress_text(25000000, 100000000, 3000000, 10.0) ==
        "25.0 / 100.0 MB (25.0%) | 0.30 M tokens/s | ETA 0:00:30");
  CHECK(tk::progress_text(0, 100, 0, 0.0) == "0.0 / 0.0 MB (0.0%) | 0.00 M tokens/s | ETA ?");
  // A job longer than the quiet time prints a line (not a terminal: plain lines).
  const std::string path = scratch_path("progress.txt");
  std::FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  {
    tk::ProgressLine line(1000000, f, /*quiet_seconds=*/0.0);
    line.add(500000, 1234);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the first line's time
  }
  REQUIRE(std::fclose(f) == 0);
  CHECK_THAT(read_bytes(path), Catch::StartsWith("tokenize: "));
}
