// Runs the tokenize binary and reads what it wrote back with the library's readers: text,
// JSON lines and gzip inputs, and the same bytes on any number of workers.
#include <sys/wait.h>
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/assets.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/data/megatron_indexed.h"
#include "runtime/data/text_documents.h"
#include "tests/data/test_files.h"
#include "tests/test_support.h"

using fsdp::testing::all_tokens;
using fsdp::testing::read_bytes;
using fsdp::testing::shipped_gpt2;
using fsdp::testing::scratch_path;
using fsdp::testing::write_bytes;
using Tokens = std::vector<int32_t>;

namespace {

// Runs tools/tokenize with `args`; returns its exit status, its output in `output`.
int run_tokenize(const std::string& args, std::string* output = nullptr) {
  const std::string log = scratch_path("tokenize_output.txt");
  const std::string command = "tools/tokenize/tokenize " + args + " > '" + log + "' 2>&1";
  const int status = std::system(command.c_str());
  if (output != nullptr) *output = read_bytes(log);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("tokenize writes llm.c train and val shards", "[data][tools]") {
  const std::string a = scratch_path("tool_a.txt"), b = scratch_path("tool_b.txt");
  write_bytes(a, "It is a truth universally acknowledged, that a single man in possession\n");
  write_bytes(b, "of a good fortune, must be in want of a wife.\n");
  const std::string out = scratch_path("austen");
  std::string log;
  REQUIRE(run_tokenize("--format llmc --val-fraction 0.25 --shard-tokens 10 --out '" + out +
                           "' '" + a + "' '" + b + "'",
                       &log) == 0);
  INFO(log);

  const Tokens expected = fsdp::data::tokenize_documents(
      shipped_gpt2(), fsdp::data::read_text_documents({a, b}, false));
  REQUIRE(expected.size() == 30);
  // 30 tokens, floor(0.25 * 30) = 7 held out; shards of at most 10 tokens.
  Tokens train, val;
  for (const char* shard : {"_train_000000.bin", "_train_000001.bin", "_train_000002.bin"}) {
    const Tokens t = all_tokens(fsdp::data::open_llmc_shard(out + shard));
    train.insert(train.end(), t.begin(), t.end());
  }
  val = all_tokens(fsdp::data::open_llmc_shard(out + "_val_000000.bin"));
  CHECK(train == Tokens(expected.begin(), expected.begin() + 23));
  CHECK(val == Tokens(expected.begin() + 23, expected.end()));
  CHECK(train.front() == 50256);
}

TEST_CASE("tokenize writes llm.c's Llama 3 shards for a vocabulary past 16 bits, or when asked",
          "[data][tools]") {
  using fsdp::data::LlmcShardFormat;
  const std::string text = scratch_path("tool_llama3.txt");
  write_bytes(text, "It is a truth universally acknowledged, that a single man in possession\n");
  // The shipped vocabulary with 20000 more (unreachable) entries: 70257 tokens.
  const std::string vocab_path = fsdp::data::locate_asset(fsdp::data::kGpt2VocabAsset);
  nlohmann::json vocab = nlohmann::json::parse(read_bytes(vocab_path));
  const int shipped = int(vocab.size());
  for (int i = 0; i < 20000; ++i) vocab["@@extra" + std::to_string(i)] = shipped + i;
  const std::string big_vocab = scratch_path("big_vocab.json");
  write_bytes(big_vocab, vocab.dump());
  const std::string merges = fsdp::data::locate_asset(fsdp::data::kGpt2MergesAsset);

  const std::string gpt2 = scratch_path("as_gpt2"), big = scratch_path("as_big_vocab"),
                    asked = scratch_path("as_llama3");
  std::string log;
  REQUIRE(run_tokenize("--out '" + gpt2 + "' '" + text + "'") == 0);
  REQUIRE(run_tokenize("--vocab '" + big_vocab + "' --merges '" + merges + "' --out '" + big +
                           "' '" + text + "'",
                       &log) == 0);
  INFO(log);
  REQUIRE(run_tokenize("--llmc-format llama-3 --out '" + asked + "' '" + text + "'") == 0);

  LlmcShardFormat format = LlmcShardFormat::fsdp_uint32;
  const Tokens expected =
      all_tokens(fsdp::data::open_llmc_shard(gpt2 + "_train_000000.bin", &format));
  CHECK(format == LlmcShardFormat::gpt2);
  for (const std::string& prefix : {big, asked}) {
    format = LlmcShardFormat::gpt2;
    const std::string shard = prefix + "_train_000000.bin";
    CHECK(all_tokens(fsdp::data::open_llmc_shard(shard, &format)) == expected);
    CHECK(format == LlmcShardFormat::llama3);
    CHECK(read_bytes(shard).substr(0, 8) == std::string("\xa1\xd9\x34\x01\x07\0\0\0", 8));
  }
  CHECK(run_tokenize("--llmc-format llama3 --out x f.txt", &log) == 2);
  CHECK(log.find("--llmc-format 'llama3'") != std::string::npos);
}

TEST_CASE("tokenize writes Megatron data sets, one document per paragraph", "[data][tools]") {
  const std::string text = scratch_path("tool_paragraphs.txt");
  write_bytes(text, "First paragraph,\ntwo lines.\n\n\nSecond one.\n  \nThird.\n");
  const std::string out = scratch_path("paragraphs");
  REQUIRE(run_tokenize("--format=megatron --split-blank-lines --val-fraction=0.3 --out='" + out +
                       "' '" + text + "'") == 0);

  const fsdp::data::MegatronDataset train(out + "_train"), val(out + "_val");
  REQUIRE(train.num_documents() == 2);
  REQUIRE(val.num_documents() == 1);
  Tokens first = shipped_gpt2().encode("First paragraph,\ntwo lines.\n");
  first.push_back(50256);  // Megatron's end-of-document token comes last
  CHECK(all_tokens(train.sequence(0)) == first);
  Tokens third = shipped_gpt2().encode("Third.\n");
  third.push_back(50256);
  CHECK(all_tokens(val.sequence(0)) == third);
  CHECK(train.index().token_type == fsdp::data::TokenType::u16);
}

TEST_CASE("tokenize reports bad arguments and files", "[data][tools]") {
  std::string log;
  CHECK(run_tokenize("--help", &log) == 0);
  CHECK(log.find("usage: tokenize") != std::string::npos);
  CHECK(run_tokenize("--out x --frobnicate 3 file.txt", &log) == 2);
  CHECK(log.find("--frobnicate") != std::string::npos);
  CHECK(run_tokenize("--out x --format csv file.txt", &log) == 2);
  CHECK(run_tokenize("--out x --val-fraction 1.5 file.txt", &log) == 2);
  CHECK(run_tokenize("--out '" + scratch_path("x") + "' no_such_input.txt", &log) == 1);
  CHECK(log.find("no_such_input.txt") != std::string::npos);
}

namespace {

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), unsigned(text.size())) == int(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// Every byte of a Megatron data set (PREFIX.bin then PREFIX.idx).
std::string megatron_bytes(const std::string& prefix) {
  return read_bytes(prefix + ".bin") + read_bytes(prefix + ".idx");
}

}  // namespace

TEST_CASE("tokenize on JSON lines (plain and gzip) gives the ids of the extracted text",
          "[data][tools]") {
  // Documents with what JSON must escape: quotes, backslashes, newlines, non-ASCII.
  const std::vector<std::string> docs = {
      "It is a truth universally acknowledged,\n\"said\" she.\n",
      "Back\\slash, tab\there, and caf\xc3\xa9 \xe2\x80\x94 done.",
      "Third document.\n\n\nWith blank lines inside.\n"};
  std::string jsonl, text_args;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string path = scratch_path("extracted_" + std::to_string(i) + ".txt");
    write_bytes(path, docs[i]);
    text_args += " '" + path + "'";
    jsonl += nlohmann::json{{"id", i}, {"text", docs[i]}}.dump() + "\n";
  }
  const std::string jsonl_path = scratch_path("docs.jsonl");
  const std::string gz_path = scratch_path("docs.jsonl.gz");
  write_bytes(jsonl_path, jsonl);
  write_gzip(gz_path, jsonl);

  for (const std::string format : {"llmc", "megatron"}) {
    const std::string from_text = scratch_path("from_text_" + format);
    const std::string from_jsonl = scratch_path("from_jsonl_" + format);
    const std::string from_gz = scratch_path("from_gz_" + format);
    REQUIRE(run_tokenize("--format " + format + " --out '" + from_text + "'" + text_args) == 0);
    REQUIRE(run_tokenize("--format " + format + " --json-key text --out '" + from_jsonl + "' '" +
                         jsonl_path + "'") == 0);
    REQUIRE(run_tokenize("--format " + format + " --json-key text --out '" + from_gz + "' '" +
                         gz_path + "'") == 0);
    if (format == "llmc") {
      const std::string text_ids = read_bytes(from_text + "_train_000000.bin");
      CHECK(read_bytes(from_jsonl + "_train_000000.bin") == text_ids);
      CHECK(read_bytes(from_gz + "_train_000000.bin") == text_ids);
      Tokens expected = fsdp::data::tokenize_documents(shipped_gpt2(), docs);
      CHECK(all_tokens(fsdp::data::open_llmc_shard(from_gz + "_train_000000.bin")) == expected);
    } else {
      CHECK(megatron_bytes(from_jsonl) == megatron_bytes(from_text));
      CHECK(megatron_bytes(from_gz) == megatron_bytes(from_text));
      CHECK(fsdp::data::MegatronDataset(from_gz).num_documents() == 3);
    }
  }
  std::string log;
  CHECK(run_tokenize("--json-key body --out '" + scratch_path("x") + "' '" + gz_path + "'",
                     &log) == 1);
  CHECK(log.find("docs.jsonl.gz line 1") != std::string::npos);
  CHECK(log.find("\"body\"") != std::string::npos);
  CHECK(run_tokenize("--json-key text --split-blank-lines --out x f.jsonl", &log) == 2);
}

TEST_CASE("tokenize keeps Megatron's JSON conventions: empty text, pre-split sentences",
          "[data][tools]") {
  // preprocess_data.py --append-eod: an empty "text" is a document of no sequences (document
  // indices [0, 1, 1, 2] for "first", "", "third"); a list's sentences are one sequence each,
  // <|endoftext|> after the last one that has tokens.
  const std::string jsonl = scratch_path("conventions.jsonl");
  write_bytes(jsonl,
              "{\"text\": \"first\"}\n{\"text\": \"\"}\n{\"text\": \"third\"}\n"
              "{\"text\": [\"One sentence.\", \" Another.\", \"\"]}\n{\"text\": []}\n");
  const std::string out = scratch_path("conventions");
  std::string log;
  REQUIRE(run_tokenize("--format megatron --json-key text --out '" + out + "' '" + jsonl + "'",
                       &log) == 0);
  INFO(log);
  const fsdp::data::MegatronDataset data(out);
  CHECK(data.index().document_indices == std::vector<int64_t>{0, 1, 1, 2, 4, 4});
  REQUIRE(data.num_sequences() == 4);
  auto with_eot = [](Tokens t) {
    t.push_back(50256);
    return t;
  };
  CHECK(all_tokens(data.sequence(0)) == with_eot(shipped_gpt2().encode("first")));
  CHECK(all_tokens(data.sequence(1)) == with_eot(shipped_gpt2().encode("third")));
  CHECK(all_tokens(data.sequence(2)) == shipped_gpt2().encode("One sentence."));
  CHECK(all_tokens(data.sequence(3)) == with_eot(shipped_gpt2().encode(" Another.")));

  // llm.c shards: a document's sentences back to back after <|endoftext|>; documents without
  // tokens add nothing.
  REQUIRE(run_tokenize("--format llmc --json-key text --out '" + out + "' '" + jsonl + "'") == 0);
  Tokens expected;
  for (const char* doc : {"first", "third"}) {
    expected.push_back(50256);
    for (int32_t t : shipped_gpt2().encode(doc)) expected.push_back(t);
  }
  expected.push_back(50256);
  for (const char* sentence : {"One sentence.", " Another."})
    for (int32_t t : shipped_gpt2().encode(sentence)) expected.push_back(t);
  CHECK(all_tokens(fsdp::data::open_llmc_shard(out + "_train_000000.bin")) == expected);
}

TEST_CASE("tokenize on several workers writes the bytes one worker writes", "[data][tools]") {
  // Several files (two of them gzip) and one large document cut into pieces.
  const std::string austen = read_bytes(fsdp::data::locate_asset("third_party/text/austen.txt"));
  std::string files;
  for (int i = 0; i < 5; ++i) {
    const std::string part = austen.substr(size_t(i) * 600000, 600000);
    const std::string path =
        scratch_path("part_" + std::to_string(i) + (i % 2 ? ".txt.gz" : ".txt"));
    if (i % 2) {
      write_gzip(path, part);
    } else {
      write_bytes(path, part);
    }
    files += " '" + path + "'";
  }
  for (const std::string flags : {"--format megatron --split-blank-lines", "--format llmc"}) {
    std::vector<std::string> outputs;
    for (const char* workers : {"1", "2", "5"}) {
      const std::string out = scratch_path(std::string("workers_") + workers);
      std::string log;
      REQUIRE(run_tokenize(flags + " --val-fraction 0.1 --workers " + workers + " --out '" + out +
                               "'" + files,
                           &log) == 0);
      INFO(log);
      CHECK(log.find(std::string(workers) + " worker(s)") != std::string::npos);
      outputs.push_back(flags.find("megatron") != std::string::npos
                            ? megatron_bytes(out + "_train") + megatron_bytes(out + "_val")
                            : read_bytes(out + "_train_000000.bin") +
                                  read_bytes(out + "_val_000000.bin"));
    }
    REQUIRE(outputs[0].size() > 1000000);
    CHECK(outputs[1] == outputs[0]);
    CHECK(outputs[2] == outputs[0]);
  }
}
