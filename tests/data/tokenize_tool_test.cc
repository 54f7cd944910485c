// Runs the tokenize binary and reads what it wrote back with the library's readers.
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

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
