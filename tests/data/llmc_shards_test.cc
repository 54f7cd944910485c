#include "runtime/data/llmc_shards.h"

#include <filesystem>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/data_loader.h"
#include "tests/data/test_files.h"
#include "tests/test_support.h"

using fsdp::DataError;
using fsdp::data::open_llmc_shard;
using fsdp::data::TokenType;
using fsdp::data::write_llmc_shard;
using fsdp::testing::all_tokens;
using fsdp::testing::poke;
using fsdp::testing::read_bytes;
using fsdp::testing::scratch_path;
using fsdp::testing::write_bytes;

namespace {

// A valid version-1 shard holding 0, 1, ..., n-1, as bytes.
std::string valid_shard_bytes(int n) {
  const std::string path = scratch_path("valid_template.bin");
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  write_llmc_shard(path, tokens.data(), tokens.size());
  return read_bytes(path);
}

}  // namespace

TEST_CASE("llm.c shards round-trip, with llm.c's exact layout", "[data][llmc]") {
  const std::string path = scratch_path("roundtrip.bin");
  const std::vector<int32_t> tokens = {50256, 15496, 995, 0, 65535, 7};
  write_llmc_shard(path, tokens.data(), tokens.size());

  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() == 1024 + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 6);
  uint16_t first;
  std::memcpy(&first, bytes.data() + 1024, 2);
  CHECK(first == 50256);

  const auto shard = open_llmc_shard(path);
  CHECK(shard.count == tokens.size());
  CHECK(shard.type == TokenType::u16);
  CHECK(shard.file == path);
  CHECK(all_tokens(shard) == tokens);
}

namespace {

// A shard as llm.c's dev/data/data_common.py write_datafile lays it out: 256 int32 (magic,
// version, token count, zeros), then the tokens as T.
template <typename T>
std::string shard_bytes(int32_t magic, int32_t version, const std::vector<int32_t>& tokens) {
  std::string bytes;
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = int32_t(tokens.size());
  for (int32_t h : header) fsdp::testing::put(bytes, h);
  for (int32_t t : tokens) fsdp::testing::put(bytes, T(t));
  return bytes;
}

}  // namespace

TEST_CASE("llm.c's Llama 3 shards: magic 20240801, version 7, uint32 tokens", "[data][llmc]") {
  using fsdp::data::LlmcShardFormat;
  const std::vector<int32_t> tokens = {128000, 5, 70000, 128001};
  const std::string llmc_bytes = shard_bytes<uint32_t>(20240801, 7, tokens);
  const std::string path = scratch_path("llama3.bin");
  write_bytes(path, llmc_bytes);
  LlmcShardFormat format = LlmcShardFormat::gpt2;
  const auto shard = open_llmc_shard(path, &format);
  CHECK(format == LlmcShardFormat::llama3);
  CHECK(shard.type == TokenType::u32);
  CHECK(all_tokens(shard) == tokens);

  // Our writer writes the same bytes; a GPT-2 shard cannot hold the tokens.
  const std::string written = scratch_path("llama3_written.bin");
  write_llmc_shard(written, tokens.data(), tokens.size(), LlmcShardFormat::llama3);
  CHECK(read_bytes(written) == llmc_bytes);
  CHECK_THROWS_AS(write_llmc_shard(scratch_path("gpt2_too_big.bin"), tokens.data(), 3),
                  fsdp::ValueError);

  // Llama 3's magic with another version, or its version under GPT-2's magic, is refused.
  for (const auto& [magic, version] : {std::pair<int32_t, int32_t>{20240801, 1}, {20240520, 7}}) {
    const std::string bad = scratch_path("llama3_version_" + std::to_string(magic) + ".bin");
    write_bytes(bad, shard_bytes<uint32_t>(magic, version, tokens));
    CHECK_THROWS_WITH(open_llmc_shard(bad),
                      Catch::Contains("byte offset 4") &&
                          Catch::Contains("version " + std::to_string(version)) &&
                          Catch::Contains("20240801 version 7 (llm.c Llama 3"));
  }
}

TEST_CASE("fsdp.cpp's own version 2 shards are still read, named as ours, never written",
          "[data][llmc]") {
  using fsdp::data::LlmcShardFormat;
  const std::vector<int32_t> tokens = {128000, 5, 70000};
  const std::string path = scratch_path("fsdp_v2.bin");
  write_bytes(path, shard_bytes<uint32_t>(20240520, 2, tokens));
  LlmcShardFormat format = LlmcShardFormat::gpt2;
  const auto shard = open_llmc_shard(path, &format);
  CHECK(format == LlmcShardFormat::fsdp_uint32);
  CHECK(shard.type == TokenType::u32);
  CHECK(all_tokens(shard) == tokens);
  CHECK_THAT(fsdp::data::llmc_format_name(format), Catch::Contains("fsdp.cpp"));
  CHECK_THROWS_AS(write_llmc_shard(scratch_path("v2_written.bin"), tokens.data(), tokens.size(),
                                   LlmcShardFormat::fsdp_uint32),
                  fsdp::ValueError);
  // A truncated one names its width.
  write_bytes(path, shard_bytes<uint32_t>(20240520, 2, tokens).substr(0, 1024 + 10));
  CHECK_THROWS_WITH(open_llmc_shard(path), Catch::Contains("byte offset 1034") &&
                                               Catch::Contains("3 tokens (uint32)"));
}

TEST_CASE("corrupt llm.c shards raise DataError with file and offset", "[data][llmc]") {
  const std::string good = valid_shard_bytes(100);  // 1224 bytes

  SECTION("missing file") {
    CHECK_THROWS_AS(open_llmc_shard(scratch_path("absent.bin")), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(scratch_path("absent.bin")), Catch::Contains("absent.bin"));
  }
  SECTION("header cut short") {
    const std::string path = scratch_path("short_header.bin");
    write_bytes(path, good.substr(0, 100));
    CHECK_THROWS_AS(open_llmc_shard(path), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(path), Catch::Contains("short_header.bin") &&
                                                 Catch::Contains("byte offset 100"));
  }
  SECTION("wrong magic") {
    std::string bytes = good;
    poke<int32_t>(bytes, 0, 20240521);
    const std::string path = scratch_path("bad_magic.bin");
    write_bytes(path, bytes);
    CHECK_THROWS_AS(open_llmc_shard(path), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(path), Catch::Contains("bad_magic.bin") &&
                                                 Catch::Contains("byte offset 0") &&
                                                 Catch::Contains("magic"));
  }
  SECTION("wrong version") {
    std::string bytes = good;
    poke<int32_t>(bytes, 4, 7);
    const std::string path = scratch_path("bad_version.bin");
    write_bytes(path, bytes);
    CHECK_THROWS_AS(open_llmc_shard(path), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(path), Catch::Contains("bad_version.bin") &&
                                                 Catch::Contains("byte offset 4") &&
                                                 Catch::Contains("version 7"));
  }
  SECTION("truncated token data") {
    const std::string path = scratch_path("truncated.bin");
    write_bytes(path, good.substr(0, 1024 + 2 * 60));
    CHECK_THROWS_AS(open_llmc_shard(path), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(path), Catch::Contains("truncated.bin") &&
                                                 Catch::Contains("byte offset 1144") &&
                                                 Catch::Contains("100 tokens"));
  }
  SECTION("trailing bytes") {
    const std::string path = scratch_path("trailing.bin");
    write_bytes(path, good + "xyz");
    CHECK_THROWS_AS(open_llmc_shard(path), DataError);
    CHECK_THROWS_WITH(open_llmc_shard(path),
                      Catch::Contains("trailing.bin") && Catch::Contains("byte offset 1224"));
  }
  SECTION("token outside the model's vocabulary") {
    std::string bytes = good;
    poke<uint16_t>(bytes, 1024 + 2 * 37, 60000);
    const std::string path = scratch_path("big_token.bin");
    write_bytes(path, bytes);
    const auto shard = open_llmc_shard(path);  // the file itself is well formed
    CHECK_NOTHROW(shard.check_vocab(65536));
    CHECK_THROWS_AS(shard.check_vocab(50257), DataError);
    CHECK_THROWS_WITH(shard.check_vocab(50257), Catch::Contains("big_token.bin") &&
                                                    Catch::Contains("byte offset 1098") &&
                                                    Catch::Contains("60000"));
  }
}

TEST_CASE("an llm.c glob reads shards in sorted order as one stream", "[data][llmc]") {
  using fsdp::data::DataFormat;
  using fsdp::data::DataLoader;
  using fsdp::data::DataSpec;
  // Written out of order; stream order must be a, b, c.
  const std::vector<int32_t> a = {0, 1, 2, 3, 4}, b = {5, 6, 7}, c = {8, 9, 10, 11, 12, 13};
  write_llmc_shard(scratch_path("glob_c.bin"), c.data(), c.size());
  write_llmc_shard(scratch_path("glob_a.bin"), a.data(), a.size());
  write_llmc_shard(scratch_path("glob_b.bin"), b.data(), b.size());

  DataSpec spec;
  spec.format = DataFormat::llmc;
  spec.path = scratch_path("glob_*.bin");
  spec.shuffle = false;  // file order: the stream's layout is what is tested
  const int64_t B = 2, T = 3;
  DataLoader loader(spec, B, T, /*dp_rank=*/0, /*dp_size=*/1, /*seed=*/1);
  CHECK(loader.num_samples() == 4);  // (14 - 1) / 3
  std::vector<int32_t> x(B * T), y(B * T);
  loader.next(x.data(), y.data());
  CHECK(x == std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  CHECK(y == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  loader.next(x.data(), y.data());  // samples 2 and 3 cross the b/c boundary
  CHECK(x == std::vector<int32_t>{6, 7, 8, 9, 10, 11});
  CHECK(y == std::vector<int32_t>{7, 8, 9, 10, 11, 12});
  loader.next(x.data(), y.data());  // the next epoch starts over
  CHECK(x == std::vector<int32_t>{0, 1, 2, 3, 4, 5});

  // A token too large for the model, in the second shard, is reported there.
  std::vector<int32_t> bad = b;
  bad[2] = 40000;
  write_llmc_shard(scratch_path("glob_b.bin"), bad.data(), bad.size());
  DataLoader reloaded(spec, B, T, 0, 1, 1);
  CHECK_THROWS_WITH(reloaded.vocab_check(32000),
                    Catch::Contains("glob_b.bin") && Catch::Contains("byte offset 1028"));
  CHECK_NOTHROW(reloaded.vocab_check(50257));

  spec.path = scratch_path("nothing_here_*.bin");
  CHECK_THROWS_AS(DataLoader(spec, B, T, 0, 1, 1), DataError);
  CHECK_THROWS_WITH(DataLoader(spec, B, T, 0, 1, 1), Catch::Contains("nothing_here_*.bin"));
}

TEST_CASE("a glob matching a directory names it as one", "[data][llmc]") {
  using fsdp::data::DataFormat;
  using fsdp::data::DataLoader;
  using fsdp::data::DataSpec;
  const std::string dir = scratch_path("glob_dir_000.bin");
  std::filesystem::create_directories(dir);
  DataSpec spec;
  spec.format = DataFormat::llmc;
  spec.path = scratch_path("glob_dir_*.bin");
  CHECK_THROWS_WITH(DataLoader(spec, 1, 4, 0, 1, 0),
                    Catch::Matchers::Contains("is not a regular file (a directory)"));
}
