#include "runtime/data/megatron_indexed.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/megatron_source.h"
#include "tests/data/test_files.h"
#include "tests/test_support.h"

using fsdp::DataError;
using fsdp::data::MegatronDataset;
using fsdp::data::MegatronSource;
using fsdp::data::MegatronWriter;
using fsdp::data::read_megatron_index;
using fsdp::data::TokenType;
using fsdp::testing::all_tokens;
using fsdp::testing::poke;
using fsdp::testing::read_bytes;
using fsdp::testing::scratch_path;
using fsdp::testing::write_bytes;
using Tokens = std::vector<int32_t>;

namespace {

// Documents whose tokens say where they come from: document d holds 1000*(d+1) + i.
std::vector<Tokens> numbered_documents(const std::vector<int>& lengths) {
  std::vector<Tokens> docs;
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    Tokens doc(lengths[d]);
    for (int i = 0; i < lengths[d]; ++i) doc[i] = 1000 * int32_t(d + 1) + i;
    docs.push_back(doc);
  }
  return docs;
}

std::string write_dataset(const std::string& name, const std::vector<Tokens>& docs,
                          TokenType type = TokenType::u16) {
  const std::string prefix = scratch_path(name);
  MegatronWriter writer(prefix, type);
  for (const Tokens& doc : docs) writer.add_document(doc);
  writer.finish();
  return prefix;
}

template <typename T>
T load(const std::string& bytes, std::size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

}  // namespace

TEST_CASE("Megatron .bin/.idx round-trip with Megatron-LM's exact layout", "[data][megatron]") {
  const auto docs = numbered_documents({5, 0, 3, 7});
  const std::string prefix = write_dataset("roundtrip", docs);

  const std::string idx = read_bytes(prefix + ".idx");
  const uint64_t S = 4, D = 5;  // D counts the document index entries: documents + 1
  REQUIRE(idx.size() == 34 + 4 * S + 8 * S + 8 * D);
  CHECK(std::memcmp(idx.data(), "MMIDIDX\0\0", 9) == 0);
  CHECK(load<uint64_t>(idx, 9) == 1);
  CHECK(uint8_t(idx[17]) == 8);  // uint16
  CHECK(load<uint64_t>(idx, 18) == S);
  CHECK(load<uint64_t>(idx, 26) == D);
  CHECK(load<int32_t>(idx, 34) == 5);                // sequence_lengths[0], unaligned
  CHECK(load<int64_t>(idx, 34 + 16 + 8 * 2) == 10);  // sequence_pointers[2] = (5 + 0) * 2
  CHECK(load<int64_t>(idx, 34 + 48 + 8 * 4) == 4);   // document_indices[4] = S
  CHECK(read_bytes(prefix + ".bin").size() == 2 * 15);

  const auto index = read_megatron_index(prefix + ".idx");
  CHECK(index.token_type == TokenType::u16);
  CHECK(index.sequence_lengths == std::vector<int32_t>{5, 0, 3, 7});
  CHECK(index.sequence_pointers == std::vector<int64_t>{0, 10, 10, 16});
  CHECK(index.document_indices == std::vector<int64_t>{0, 1, 2, 3, 4});

  const MegatronDataset data(prefix);
  CHECK(data.num_documents() == 4);
  CHECK(data.num_tokens() == 15);
  for (uint64_t i = 0; i < 4; ++i) CHECK(all_tokens(data.sequence(i)) == docs[i]);
}

TEST_CASE("Megatron data sets store any integer token width", "[data][megatron]") {
  const std::vector<Tokens> docs = {{100000, -5, 3}, {2147483647}};
  const std::string prefix = write_dataset("int32", docs, TokenType::i32);
  const MegatronDataset data(prefix);
  CHECK(data.index().token_type == TokenType::i32);
  CHECK(all_tokens(data.sequence(0)) == docs[0]);
  CHECK(all_tokens(data.sequence(1)) == docs[1]);
  MegatronWriter narrow(scratch_path("narrow"), TokenType::u8);
  CHECK_THROWS_AS(narrow.add_document(Tokens{255, 256}), fsdp::ValueError);
}

TEST_CASE("Megatron documents of several sequences, or of none, as preprocess_data.py writes",
          "[data][megatron]") {
  const std::string prefix = scratch_path("multi");
  MegatronWriter writer(prefix);
  writer.add_document(Tokens{1, 2, 3});  // "first"
  writer.end_document();                 // "": kept, no sequences
  writer.add_sequence(Tokens{4, 5}.data(), 2);  // two sentences
  writer.add_sequence(Tokens{6}.data(), 1);
  writer.end_document();
  writer.add_sequence(Tokens{7}.data(), 1);
  CHECK_THROWS_AS(writer.finish(), fsdp::ValueError);  // the last document was not ended
  writer.end_document();
  writer.finish();

  const auto data = std::make_shared<const MegatronDataset>(prefix);
  CHECK(data->index().document_indices == std::vector<int64_t>{0, 1, 1, 3, 4});
  CHECK(data->index().sequence_lengths == std::vector<int32_t>{3, 2, 1, 1});
  CHECK(data->num_documents() == 4);
  // Samples run over the empty document and keep a document's sequences together.
  MegatronSource source(data, 6, 1, /*shuffle_documents=*/false, 0, 4);
  Tokens sample(7);
  source.read_sample(0, 0, sample.data());
  CHECK(sample == Tokens{1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("corrupt Megatron files raise DataError with file and offset", "[data][megatron]") {
  const auto docs = numbered_documents({4, 6, 2});
  const std::string good_prefix = write_dataset("good", docs);
  const std::string good_idx = read_bytes(good_prefix + ".idx");
  const std::string good_bin = read_bytes(good_prefix + ".bin");
  // Writes a data set from edited bytes and returns its prefix.
  auto with = [&](const std::string& name, const std::string& idx, const std::string& bin) {
    const std::string prefix = scratch_path(name);
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", bin);
    return prefix;
  };

  SECTION("missing files") {
    CHECK_THROWS_WITH(MegatronDataset(scratch_path("nowhere")),
                      Catch::Contains("nowhere.idx"));
    const std::string prefix = scratch_path("no_bin");
    write_bytes(prefix + ".idx", good_idx);
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("no_bin.bin"));
  }
  SECTION("wrong magic") {
    std::string idx = good_idx;
    idx[3] = 'X';
    const auto prefix = with("mg_magic", idx, good_bin);
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("mg_magic.idx") &&
                                                   Catch::Contains("byte offset 0"));
  }
  SECTION("wrong version") {
    std::string idx = good_idx;
    poke<uint64_t>(idx, 9, 2);
    const auto prefix = with("mg_version", idx, good_bin);
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("mg_version.idx") &&
                                                   Catch::Contains("byte offset 9"));
  }
  SECTION("a float dtype") {
    std::string idx = good_idx;
    idx[17] = 7;
    const auto prefix = with("mg_dtype", idx, good_bin);
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("mg_dtype.idx") &&
                                                   Catch::Contains("byte offset 17"));
  }
  SECTION("truncated index") {
    const auto prefix = with("mg_short_idx", good_idx.substr(0, good_idx.size() - 5), good_bin);
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    CHECK_THROWS_WITH(MegatronDataset(prefix),
                      Catch::Contains("mg_short_idx.idx") &&
                          Catch::Contains("byte offset " + std::to_string(good_idx.size() - 5)));
    const auto tiny = with("mg_tiny_idx", good_idx.substr(0, 20), good_bin);
    CHECK_THROWS_WITH(MegatronDataset(tiny), Catch::Contains("mg_tiny_idx.idx") &&
                                                 Catch::Contains("byte offset 20"));
  }
  SECTION("document indices out of order") {
    std::string idx = good_idx;
    const std::size_t docs_at = 34 + 12 * 3;
    poke<int64_t>(idx, docs_at + 8 * 2, 0);  // document_indices = {0, 1, 0, 3}
    const auto prefix = with("mg_docs", idx, good_bin);
    CHECK_THROWS_WITH(MegatronDataset(prefix),
                      Catch::Contains("mg_docs.idx") &&
                          Catch::Contains("byte offset " + std::to_string(docs_at + 16)));
  }
  SECTION("truncated token file") {
    const auto prefix = with("mg_short_bin", good_idx, good_bin.substr(0, 20));
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    // The last sequence (2 tokens at byte 20) no longer fits; its pointer is at .idx byte
    // 34 + 4*3 + 8*2 = 62.
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("mg_short_bin.bin") &&
                                                   Catch::Contains("byte offset 20") &&
                                                   Catch::Contains("byte offset 62"));
  }
  SECTION("token outside the model's vocabulary") {
    std::string bin = good_bin;
    poke<uint16_t>(bin, 2 * 7, 51000);  // document 1, token 3
    const auto prefix = with("mg_vocab", good_idx, bin);
    const MegatronDataset data(prefix);
    CHECK_NOTHROW(data.check_vocab(60000));
    CHECK_THROWS_AS(data.check_vocab(50257), DataError);
    CHECK_THROWS_WITH(data.check_vocab(50257), Catch::Contains("mg_vocab.bin") &&
                                                   Catch::Contains("byte offset 14") &&
                                                   Catch::Contains("51000"));
  }
}

TEST_CASE("a dtype code that does not match the data is refused, naming the dtype",
          "[data][megatron]") {
  // Lengths 4, 6, 2: pointers 0, 8, 20 as uint16 (code 8), 0, 16, 40 as int32 (code 4).
  const auto docs = numbered_documents({4, 6, 2});
  const std::string u16 = write_dataset("dtype_u16", docs, TokenType::u16);
  const std::string i32 = write_dataset("dtype_i32", docs, TokenType::i32);
  const std::size_t pointers_at = 34 + 4 * 3;
  auto with = [&](const std::string& name, const std::string& idx, const std::string& bin) {
    const std::string prefix = scratch_path(name);
    write_bytes(prefix + ".idx", idx);
    write_bytes(prefix + ".bin", bin);
    return prefix;
  };

  SECTION("code 1 (uint8) on uint16 data: the pointers are 2 bytes per token") {
    std::string idx = read_bytes(u16 + ".idx");
    idx[17] = 1;
    const auto prefix = with("dtype_1_on_u16", idx, read_bytes(u16 + ".bin"));
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    CHECK_THROWS_WITH(read_megatron_index(prefix + ".idx"),
                      Catch::Contains("dtype_1_on_u16.idx") &&
                          Catch::Contains("byte offset " + std::to_string(pointers_at + 8)) &&
                          Catch::Contains("sequence 1 starts at .bin byte 8") &&
                          Catch::Contains("4 tokens of uint8, dtype code 1") &&
                          Catch::Contains("2 bytes per token"));
  }
  SECTION("code 8 (uint16) on int32 data, Megatron's dtype for large vocabularies") {
    std::string idx = read_bytes(i32 + ".idx");
    idx[17] = 8;
    const auto prefix = with("dtype_8_on_i32", idx, read_bytes(i32 + ".bin"));
    CHECK_THROWS_AS(MegatronDataset(prefix), DataError);
    CHECK_THROWS_WITH(MegatronDataset(prefix),
                      Catch::Contains("dtype_8_on_i32.idx") &&
                          Catch::Contains("byte offset " + std::to_string(pointers_at + 8)) &&
                          Catch::Contains("uint16") && Catch::Contains("4 bytes per token"));
  }
  SECTION("a pointer that skips bytes or goes back") {
    std::string idx = read_bytes(u16 + ".idx");
    poke<int64_t>(idx, pointers_at + 16, 22);  // sequence 2 at 22 instead of 20
    CHECK_THROWS_WITH(MegatronDataset(with("dtype_gap", idx, read_bytes(u16 + ".bin"))),
                      Catch::Contains("byte offset " + std::to_string(pointers_at + 16)) &&
                          Catch::Contains("sequence 2 starts at .bin byte 22") &&
                          Catch::Contains("end at byte 20"));
    poke<int64_t>(idx, pointers_at + 16, -2);
    CHECK_THROWS_AS(MegatronDataset(with("dtype_negative", idx, read_bytes(u16 + ".bin"))),
                    DataError);
  }
  SECTION("an index and a .bin of different widths, the pointers consistent") {
    // int32 index (48 bytes of tokens) over the uint16 data (24 bytes), and the reverse.
    const auto short_bin = with("dtype_i32_idx_u16_bin", read_bytes(i32 + ".idx"),
                                read_bytes(u16 + ".bin"));
    CHECK_THROWS_WITH(MegatronDataset(short_bin),
                      Catch::Contains("dtype_i32_idx_u16_bin.bin") &&
                          Catch::Contains("truncated at byte offset 24") &&
                          Catch::Contains("2 bytes per token") && Catch::Contains("int32"));
    const auto long_bin = with("dtype_u16_idx_i32_bin", read_bytes(u16 + ".idx"),
                               read_bytes(i32 + ".bin"));
    CHECK_THROWS_WITH(MegatronDataset(long_bin),
                      Catch::Contains("dtype_u16_idx_i32_bin.bin") &&
                          Catch::Contains("24 unexpected bytes from byte offset 24") &&
                          Catch::Contains("4 bytes per token") && Catch::Contains("uint16"));
  }
  SECTION("bytes after the last sequence") {
    const auto prefix = with("dtype_trailing", read_bytes(u16 + ".idx"),
                             read_bytes(u16 + ".bin") + "x");
    CHECK_THROWS_WITH(MegatronDataset(prefix), Catch::Contains("dtype_trailing.bin") &&
                                                   Catch::Contains("byte offset 24"));
  }
  SECTION("the float codes are named") {
    for (const auto& [code, name] : {std::pair<char, std::string>{6, "float64"}, {7, "float32"}}) {
      std::string idx = read_bytes(u16 + ".idx");
      idx[17] = code;
      const auto prefix = with("dtype_" + name, idx, read_bytes(u16 + ".bin"));
      CHECK_THROWS_WITH(MegatronDataset(prefix),
                        Catch::Contains("dtype_" + name + ".idx' byte offset 17") &&
                            Catch::Contains("dtype code " + std::to_string(code) + " is " + name));
    }
  }
}

namespace {

// All samples of one epoch, in index order.
std::vector<Tokens> epoch_samples(MegatronSource& source, uint64_t epoch) {
  std::vector<Tokens> samples;
  for (uint64_t i = 0; i < source.num_samples(); ++i) {
    Tokens s(source.seq_len() + 1);
    source.read_sample(epoch, i, s.data());
    samples.push_back(s);
  }
  return samples;
}

// Joins samples that overlap by one token back into the token run they were cut from.
Tokens join_overlapping(const std::vector<Tokens>& samples) {
  Tokens run = samples.front();
  for (std::size_t i = 1; i < samples.size(); ++i) {
    REQUIRE(samples[i].front() == run.back());  // consecutive samples share one token
    run.insert(run.end(), samples[i].begin() + 1, samples[i].end());
  }
  return run;
}

// Which document each token run starts with, reading the numbered tokens.
std::vector<int> document_order(const Tokens& run) {
  std::vector<int> order;
  for (std::size_t i = 0; i < run.size(); ++i) {
    if (run[i] % 1000 == 0) order.push_back(run[i] / 1000 - 1);
  }
  return order;
}

}  // namespace

TEST_CASE("Megatron samples: documents concatenated, cut with one token of overlap",
          "[data][megatron]") {
  const auto docs = numbered_documents({7, 3, 12, 5, 9, 4});  // 40 tokens
  auto data = std::make_shared<const MegatronDataset>(write_dataset("samples", docs));
  const int64_t T = 6;

  SECTION("in file order") {
    MegatronSource source(data, T, /*seed=*/1, /*shuffle_documents=*/false, 0, 6);
    CHECK(source.num_samples() == 6);  // (40 - 1) / 6
    Tokens all;
    for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
    const Tokens run = join_overlapping(epoch_samples(source, 0));
    CHECK(run == Tokens(all.begin(), all.begin() + 6 * T + 1));
  }
  SECTION("shuffled documents: a seeded permutation per epoch") {
    MegatronSource a(data, T, 42, true, 0, 6), b(data, T, 42, true, 0, 6),
        c(data, T, 43, true, 0, 6);
    const auto order_a0 = document_order(join_overlapping(epoch_samples(a, 0)));
    const auto order_a1 = document_order(join_overlapping(epoch_samples(a, 1)));
    // Every document starts in the run except possibly those cut off after sample N-1.
    std::vector<int> sorted = order_a0;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    CHECK(sorted.size() >= 5);
    CHECK(order_a0 == document_order(join_overlapping(epoch_samples(b, 0))));  // same seed
    CHECK(order_a0 != document_order(join_overlapping(epoch_samples(c, 0))));  // other seed
    CHECK(order_a0 != order_a1);                                               // new epoch
    // Going back to an earlier epoch gives it again.
    CHECK(order_a0 == document_order(join_overlapping(epoch_samples(a, 0))));
  }
  SECTION("a document range for held-out splits") {
    MegatronSource tail(data, 4, 1, false, 4, 6);  // documents 4 and 5: 13 tokens
    CHECK(tail.num_samples() == 3);
    const Tokens run = join_overlapping(epoch_samples(tail, 0));
    CHECK(run.front() == 5000);
    CHECK(run.back() == 6003);
    CHECK_THROWS_AS(MegatronSource(data, 20, 1, false, 5, 6), DataError);  // 4 tokens < 21
  }
}
