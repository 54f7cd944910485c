#include "runtime/data/tokenizer.h"

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/assets.h"
#include "runtime/data/files.h"
#include "tests/data/test_files.h"
#include "tests/test_support.h"

using fsdp::data::Gpt2Tokenizer;
using Ids = std::vector<int32_t>;
using fsdp::testing::shipped_gpt2;

namespace {

// FNV-1a over the ids' little-endian 4-byte encodings.
uint64_t fnv1a(const Ids& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int32_t id : ids) {
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

}  // namespace

TEST_CASE("the GPT-2 vocabulary loads", "[data][tokenizer]") {
  CHECK(shipped_gpt2().vocab_size() == 50257);
  CHECK(shipped_gpt2().eot_token() == 50256);
  CHECK(shipped_gpt2().num_merges() == 50000);
}

// Golden ids were computed with two independent implementations of OpenAI's GPT-2 encoder
// (the npm packages gpt-3-encoder 1.1.4 and gpt-tokenizer's r50k_base), which agree.
TEST_CASE("encode matches GPT-2's golden ids", "[data][tokenizer]") {
  auto& tok = shipped_gpt2();
  CHECK(tok.encode("Hello world") == Ids{15496, 995});
  CHECK(tok.encode(" The quick brown fox") == Ids{383, 2068, 7586, 21831});
  CHECK(tok.encode("I'm sure it's fine, they'll say; we've, you're, she'd, can't.") ==
        Ids{40, 1101, 1654, 340, 338, 3734, 11, 484, 1183, 910, 26, 356,
            1053, 11, 345, 821, 11, 673, 1549, 11, 460, 470, 13});
  CHECK(tok.encode("Numbers: 1234567 and 3.14159, \xC2\xBD and x\xC2\xB2!") ==
        Ids{49601, 25, 17031, 2231, 3134, 290, 513, 13, 1415, 19707, 11, 25208, 290, 2124,
            31185, 0});
  CHECK(tok.encode("multiple   spaces   here") == Ids{48101, 220, 220, 9029, 220, 220, 994});
  CHECK(tok.encode("line1\nline2\n\nline3\n") ==
        Ids{1370, 16, 198, 1370, 17, 198, 198, 1370, 18, 198});
  CHECK(tok.encode("caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x9Cn\xC3\xAF"
                   "c\xC3\xB6" "d\xC3\xA9") ==
        Ids{66, 1878, 2634, 41492, 40560, 16345, 2634, 49363, 77, 26884, 66, 9101, 67, 2634});
  CHECK(tok.encode("emoji \xF0\x9F\x99\x82\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD done") ==
        Ids{368, 31370, 32485, 41840, 235, 8582, 237, 121, 1760});
  CHECK(tok.encode("tabs\tand\r\nCRLF") == Ids{8658, 82, 197, 392, 201, 198, 34, 7836, 37});
  CHECK(tok.encode("  leading and trailing  ") == Ids{220, 3756, 290, 25462, 220, 220});
  CHECK(tok.encode("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD"
                   "\xE3\x82\xB9\xE3\x83\x88") ==  // 日本語のテキスト
        Ids{33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302});
  CHECK(tok.encode("'S 'LL ''s x'''s") == Ids{6, 50, 705, 3069, 10148, 82, 2124, 7061, 6, 82});
  CHECK(tok.encode("a \n\n b") == Ids{64, 220, 628, 275});
  CHECK(tok.encode("wait...   what?!") == Ids{17077, 986, 220, 220, 644, 12248});
  CHECK(tok.encode(",,,, ,,, ,,") == Ids{23846, 837, 9832, 837, 11});
  CHECK(tok.encode("").empty());
}

TEST_CASE("<|endoftext|> is special only when allowed", "[data][tokenizer]") {
  auto& tok = shipped_gpt2();
  CHECK(tok.encode("<|endoftext|>") == Ids{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(tok.encode("<|endoftext|>", /*allow_special=*/true) == Ids{50256});
  CHECK(tok.encode("Hello<|endoftext|> world<|endoftext|>", true) ==
        Ids{15496, 50256, 995, 50256});
  CHECK(tok.decode(Ids{15496, 50256, 995}) == "Hello<|endoftext|> world");
}

TEST_CASE("decode inverts encode on arbitrary bytes", "[data][tokenizer]") {
  auto& tok = shipped_gpt2();
  for (const std::string s :
       {"Hello world", "caf\xC3\xA9 \xF0\x9F\x99\x82", "  \n\t \r\n x", "\xFF\xFE\x80 ok",
        "\xE6\x97\xA5\xE6\x9C\xAC"}) {
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(static_cast<std::size_t>(trial % 40), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    INFO("trial " << trial);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
}

TEST_CASE("decode rejects ids outside the vocabulary", "[data][tokenizer]") {
  CHECK_THROWS_AS(shipped_gpt2().decode(Ids{15496, 50257}), fsdp::ValueError);
  CHECK_THROWS_WITH(shipped_gpt2().decode(Ids{15496, -1}), Catch::Contains("position 1"));
}

// The whole default corpus against the reference encoders: 993,338 tokens with this checksum.
TEST_CASE("the Austen corpus encodes exactly as the reference, quickly", "[data][tokenizer]") {
  const std::string text = fsdp::data::read_file(fsdp::data::locate_asset(
      fsdp::data::kDefaultTextAsset));
  REQUIRE(text.size() > 4'000'000);
  Gpt2Tokenizer tok(fsdp::data::locate_asset(fsdp::data::kGpt2VocabAsset),
                    fsdp::data::locate_asset(fsdp::data::kGpt2MergesAsset));
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(ids.size() == 993338);
  CHECK(fnv1a(ids) == 0xe52d789d179b49baull);
  CHECK(Ids(ids.begin(), ids.begin() + 6) == Ids{50, 24290, 5357, 44738, 11584, 25382});
  CHECK(tok.decode(ids) == text);
  // 4 MB in well under the budget of "a few seconds", even in an unoptimized build.
  CHECK(seconds < 10.0);
  WARN("encoded " << text.size() << " bytes in " << seconds << " s");
}

TEST_CASE("bad tokenizer files raise DataError naming the file and entry", "[data][tokenizer]") {
  using fsdp::testing::scratch_path;
  using fsdp::testing::write_bytes;
  const std::string vocab = fsdp::data::locate_asset(fsdp::data::kGpt2VocabAsset);
  const std::string merges = fsdp::data::locate_asset(fsdp::data::kGpt2MergesAsset);

  CHECK_THROWS_AS(Gpt2Tokenizer("no/such/encoder.json", merges), fsdp::DataError);
  CHECK_THROWS_WITH(Gpt2Tokenizer("no/such/encoder.json", merges),
                    Catch::Contains("no/such/encoder.json"));

  const std::string bad_json = scratch_path("bad_vocab.json");
  write_bytes(bad_json, "{\"a\": 0,");
  CHECK_THROWS_WITH(Gpt2Tokenizer(bad_json, merges),
                    Catch::Contains("bad_vocab.json") && Catch::Contains("not valid JSON"));

  const std::string deep = scratch_path("deep_vocab.json");
  write_bytes(deep, "{\"a\": " + std::string(10000, '[') + std::string(10000, ']') + "}");
  CHECK_THROWS_WITH(Gpt2Tokenizer(deep, merges),
                    Catch::Contains("deep_vocab.json") && Catch::Contains("nested deeper than 128"));

  const std::string sparse = scratch_path("sparse_vocab.json");
  write_bytes(sparse, "{\"a\": 0, \"b\": 5}");
  CHECK_THROWS_WITH(Gpt2Tokenizer(sparse, merges),
                    Catch::Contains("sparse_vocab.json") && Catch::Contains("\"b\""));

  const std::string bad_merges = scratch_path("bad_merges.bpe");
  write_bytes(bad_merges, "#version: 0.2\n\xC4\xA0 t\nthis line is wrong\n");
  CHECK_THROWS_WITH(Gpt2Tokenizer(vocab, bad_merges),
                    Catch::Contains("bad_merges.bpe") && Catch::Contains("line 3"));

  const std::string unknown = scratch_path("unknown_merges.bpe");
  write_bytes(unknown, "#version: 0.2\n\xC4\xA0 t\nzzzzzzzzzz zzzzzzzzzzzzz\n");
  CHECK_THROWS_WITH(Gpt2Tokenizer(vocab, unknown),
                    Catch::Contains("unknown_merges.bpe") && Catch::Contains("line 3") &&
                        Catch::Contains("not in the vocabulary"));
}
