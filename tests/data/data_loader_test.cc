#include "runtime/data/data_loader.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/assets.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/data/megatron_indexed.h"
#include "runtime/data/megatron_source.h"
#include "runtime/data/tokenizer.h"
#include "tests/data/test_files.h"
#include "tests/test_support.h"

using fsdp::data::DataFormat;
using fsdp::data::DataLoader;
using fsdp::data::DataSpec;
using fsdp::data::DataSplit;
using fsdp::data::SampleSource;
using fsdp::data::TokenStreamSource;
using fsdp::testing::scratch_path;
using Tokens = std::vector<int32_t>;

namespace {

constexpr int64_t kT = 4;

// A stream 0, 1, ..., n-1: sample i then starts with token i*T, which names it.
std::unique_ptr<SampleSource> counting_stream(int32_t n, int64_t T = kT) {
  Tokens tokens(n);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<fsdp::data::TokenArray> pieces = {
      fsdp::data::tokens_in_memory(tokens, "counting stream")};
  return std::make_unique<TokenStreamSource>(std::move(pieces), T, 0, uint64_t(n), "counting");
}

// A small Megatron data set of numbered documents, written once.
std::string megatron_prefix() {
  const std::string prefix = scratch_path("loader_megatron");
  fsdp::data::MegatronWriter writer(prefix);
  for (int d = 0; d < 9; ++d) {
    Tokens doc(3 + (d * 5) % 7);
    for (std::size_t i = 0; i < doc.size(); ++i) doc[i] = 100 * (d + 1) + int32_t(i);
    writer.add_document(doc);
  }
  writer.finish();
  return prefix;
}

// The kinds of source the ordering property must hold for.
enum class Kind { stream, shuffled_stream, megatron };

std::unique_ptr<DataLoader> make_loader(Kind kind, int64_t B, int rank, int dp, uint64_t seed) {
  switch (kind) {
    case Kind::stream:
      return std::make_unique<DataLoader>(counting_stream(83), B, rank, dp, seed, false);
    case Kind::shuffled_stream:
      return std::make_unique<DataLoader>(counting_stream(83), B, rank, dp, seed, true);
    case Kind::megatron: {
      DataSpec spec;
      spec.format = DataFormat::megatron;
      spec.path = megatron_prefix();
      return std::make_unique<DataLoader>(spec, B, kT, rank, dp, seed);
    }
  }
  return nullptr;
}

struct Batch {
  Tokens inputs, targets;
  bool operator==(const Batch& o) const { return inputs == o.inputs && targets == o.targets; }
};

Batch next_batch(DataLoader& loader) {
  const std::size_t n = std::size_t(loader.micro_batch_size() * loader.seq_len());
  Batch b{Tokens(n), Tokens(n)};
  loader.next(b.inputs.data(), b.targets.data());
  return b;
}

}  // namespace

TEST_CASE("targets are the inputs shifted by one token", "[data][loader]") {
  DataLoader loader(counting_stream(100), /*B=*/3, 0, 1, 0, false);
  const Batch b = next_batch(loader);
  CHECK(b.inputs == Tokens{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(b.targets == Tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
}

TEST_CASE("all ranks together read exactly what one process reads", "[data][loader]") {
  const int64_t B = 3;
  const int steps_single = 24;  // several epochs of every source
  for (const Kind kind : {Kind::stream, Kind::shuffled_stream, Kind::megatron}) {
    auto single = make_loader(kind, B, 0, 1, /*seed=*/5);
    std::vector<Batch> reference;
    for (int s = 0; s < steps_single; ++s) reference.push_back(next_batch(*single));

    for (const int dp : {1, 2, 4}) {
      INFO("source kind " << int(kind) << ", dp " << dp);
      std::vector<std::unique_ptr<DataLoader>> ranks;
      for (int r = 0; r < dp; ++r) ranks.push_back(make_loader(kind, B, r, dp, 5));
      for (int step = 0; step < steps_single / dp; ++step) {
        for (int r = 0; r < dp; ++r) {
          // Rank r's batch at this step is global micro-batch step*dp + r.
          CHECK(next_batch(*ranks[r]) == reference[step * dp + r]);
        }
      }
      for (int r = 0; r < dp; ++r) CHECK(ranks[r]->position() == uint64_t(steps_single * B));
    }
  }
}

TEST_CASE("within an epoch ranks read disjoint samples that cover it", "[data][loader]") {
  // 83 tokens, T = 4: 20 samples; B = 5: an epoch is 4 global micro-batches.
  for (const bool shuffle : {false, true}) {
    for (const int dp : {1, 2, 4}) {
      std::multiset<int32_t> firsts;  // first token of each sample = 4 * sample index
      for (int r = 0; r < dp; ++r) {
        DataLoader loader(counting_stream(83), 5, r, dp, 9, shuffle);
        for (int step = 0; step < 4 / dp; ++step) {
          const Batch b = next_batch(loader);
          for (int i = 0; i < 5; ++i) firsts.insert(b.inputs[i * kT]);
        }
      }
      INFO("shuffle " << shuffle << ", dp " << dp);
      CHECK(firsts.size() == 20);
      for (int32_t i = 0; i < 20; ++i) CHECK(firsts.count(i * int32_t(kT)) == 1);
    }
  }
}

TEST_CASE("shuffling is seeded and changes every epoch", "[data][loader]") {
  auto epoch_order = [](uint64_t seed, int epoch) {
    DataLoader loader(counting_stream(83), 20, 0, 1, seed, true);  // one batch = one epoch
    Batch b;
    for (int e = 0; e <= epoch; ++e) b = next_batch(loader);
    Tokens firsts;
    for (int i = 0; i < 20; ++i) firsts.push_back(b.inputs[i * kT]);
    return firsts;
  };
  const Tokens e0 = epoch_order(1, 0);
  CHECK(e0 == epoch_order(1, 0));
  CHECK(e0 != epoch_order(2, 0));
  CHECK(e0 != epoch_order(1, 1));
  Tokens sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  Tokens expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i * int32_t(kT);
  CHECK(sorted == expected);  // a permutation of the epoch
  CHECK(e0 != expected);      // and not the identity
}

TEST_CASE("position and seek resume the same global batches", "[data][loader]") {
  for (const Kind kind : {Kind::stream, Kind::shuffled_stream, Kind::megatron}) {
    INFO("source kind " << int(kind));
    auto single = make_loader(kind, 2, 0, 1, 3);
    std::vector<Batch> reference;
    for (int s = 0; s < 16; ++s) reference.push_back(next_batch(*single));
    CHECK(single->position() == 32);  // samples

    // A 2-rank run stops after 3 steps; a 4-rank run resumes from its position.
    auto r1 = make_loader(kind, 2, 1, 2, 3);
    for (int s = 0; s < 3; ++s) next_batch(*r1);
    CHECK(r1->position() == 12);
    auto resumed = make_loader(kind, 2, 0, 1, 3);
    resumed->seek(16);
    CHECK(next_batch(*resumed) == reference[8]);
    for (int r = 0; r < 4; ++r) {
      auto loader = make_loader(kind, 2, r, 4, 3);
      loader->seek(16);
      CHECK(loader->position() == 16);
      CHECK(next_batch(*loader) == reference[8 + r]);
      CHECK(next_batch(*loader) == reference[12 + r]);
    }
    // Seeking backwards replays.
    single->seek(0);
    CHECK(next_batch(*single) == reference[0]);
  }
}

TEST_CASE("a resume with another micro-batch size continues at the next unread sample",
          "[data][loader]") {
  // The samples of the reference run, one per micro-batch.
  for (const Kind kind : {Kind::stream, Kind::shuffled_stream, Kind::megatron}) {
    INFO("source kind " << int(kind));
    auto one = make_loader(kind, 1, 0, 1, 3);
    std::vector<Batch> samples;
    for (int s = 0; s < 30; ++s) samples.push_back(next_batch(*one));
    // Two steps of 2 ranks x micro-batch 2 consumed samples [0, 8)...
    auto before = make_loader(kind, 2, 0, 2, 3);
    next_batch(*before);
    next_batch(*before);
    REQUIRE(before->position() == 8);
    // ...and one rank with micro-batch 3 reads samples 8, 9, 10 next, then 11, 12, 13.
    auto after = make_loader(kind, 3, 0, 1, 3);
    after->seek(before->position());
    for (int step = 0; step < 2; ++step) {
      const Batch b = next_batch(*after);
      for (int i = 0; i < 3; ++i) {
        const Batch& want = samples[size_t(8 + 3 * step + i)];
        CHECK(Tokens(b.inputs.begin() + i * kT, b.inputs.begin() + (i + 1) * kT) == want.inputs);
        CHECK(Tokens(b.targets.begin() + i * kT, b.targets.begin() + (i + 1) * kT) == want.targets);
      }
    }
    CHECK(after->position() == 14);
  }
}

TEST_CASE("the default loader shuffles every format: consecutive samples are not neighbours",
          "[data][loader]") {
  // An llm.c shard counting 0, 1, 2, ...: a sample's first token says where it starts.
  const std::string shard = scratch_path("counting_000000.bin");
  Tokens tokens(4000);
  std::iota(tokens.begin(), tokens.end(), 0);
  fsdp::data::write_llmc_shard(shard, tokens.data(), tokens.size());
  DataSpec spec;  // defaults, as a recipe leaves them
  spec.format = DataFormat::llmc;
  spec.path = shard;
  const int64_t T = 16, B = 8;
  DataLoader loader(spec, B, T, 0, 1, /*seed=*/1234);
  int neighbours = 0, pairs = 0;
  int32_t previous = -1;
  for (int step = 0; step < 10; ++step) {
    const Batch b = next_batch(loader);
    for (int64_t i = 0; i < B; ++i) {
      const int32_t first = b.inputs[size_t(i * T)];
      if (previous >= 0) {
        ++pairs;
        if (first == previous + T) ++neighbours;
      }
      previous = first;
    }
  }
  // 79 pairs of 249 samples: an ordered reader has 79 neighbours, a shuffle about 0.3.
  CHECK(pairs == 79);
  CHECK(neighbours <= 2);
  // dataset.shuffle=false reads in file order.
  spec.shuffle = false;
  DataLoader ordered(spec, B, T, 0, 1, 1234);
  const Batch b = next_batch(ordered);
  for (int64_t i = 0; i < B; ++i) CHECK(b.inputs[size_t(i * T)] == int32_t(i * T));
}

TEST_CASE("sample_refs and stream offsets name the samples a step reads", "[data][loader]") {
  DataLoader loader(counting_stream(83), 3, 0, 1, /*seed=*/4, true);  // 20 samples per epoch
  const std::vector<DataLoader::SampleRef> refs = loader.sample_refs(18, 6);  // crosses an epoch
  REQUIRE(refs.size() == 6);
  CHECK(refs[0].epoch == 0);
  CHECK(refs[2].epoch == 1);
  loader.seek(18);
  for (int step = 0; step < 2; ++step) {
    const Batch b = next_batch(loader);
    for (int i = 0; i < 3; ++i) {
      const DataLoader::SampleRef& r = refs[size_t(3 * step + i)];
      const auto offset = loader.source().stream_offset(r.epoch, r.index);
      REQUIRE(offset.has_value());
      CHECK(b.inputs[size_t(i * kT)] == int32_t(*offset));  // token value = stream offset
    }
  }
}

TEST_CASE("bad loader arguments are rejected", "[data][loader]") {
  CHECK_THROWS_AS(DataLoader(counting_stream(40), 0, 0, 1, 0, false), fsdp::ValueError);
  CHECK_THROWS_AS(DataLoader(counting_stream(40), 2, 2, 2, 0, false), fsdp::ValueError);
  CHECK_THROWS_AS(counting_stream(4), fsdp::DataError);  // 4 tokens < T + 1
  CHECK_THROWS_AS(fsdp::data::parse_data_format("json"), fsdp::ConfigError);
  CHECK(fsdp::data::parse_data_format("megatron") == DataFormat::megatron);
}

TEST_CASE("plain text is tokenized with EOT before each file and split head/tail",
          "[data][loader]") {
  const std::string a = scratch_path("text_a.txt"), b = scratch_path("text_b.txt");
  fsdp::testing::write_bytes(a, "Hello world");
  fsdp::testing::write_bytes(b, " The quick brown fox");
  // The stream: 50256 Hello world 50256 The quick brown fox = 8 tokens.
  const Tokens stream = {50256, 15496, 995, 50256, 383, 2068, 7586, 21831};

  DataSpec spec;
  spec.format = DataFormat::text;
  spec.path = scratch_path("text_*.txt");
  spec.shuffle = false;                 // file order: the stream's layout is what is tested
  DataLoader all(spec, 1, 3, 0, 1, 0);  // shipped GPT-2 tokenizer by default
  CHECK(all.num_samples() == 2);        // (8 - 1) / 3
  Batch x = next_batch(all);
  CHECK(x.inputs == Tokens(stream.begin(), stream.begin() + 3));
  CHECK(x.targets == Tokens(stream.begin() + 1, stream.begin() + 4));
  x = next_batch(all);
  CHECK(x.inputs == Tokens(stream.begin() + 3, stream.begin() + 6));
  CHECK_NOTHROW(all.vocab_check(50257));
  CHECK_THROWS_AS(all.vocab_check(50000), fsdp::DataError);  // EOT does not fit

  // Hold out the last 3/8: head = tokens [0, 5), tail = [5, 8).
  spec.split = DataSplit::head;
  spec.holdout_fraction = 0.375;
  DataLoader head(spec, 1, 2, 0, 1, 0);
  CHECK(head.num_samples() == 2);
  CHECK(next_batch(head).inputs == Tokens{50256, 15496});
  spec.split = DataSplit::tail;
  DataLoader tail(spec, 1, 2, 0, 1, 0);
  CHECK(tail.num_samples() == 1);
  CHECK(next_batch(tail).inputs == Tokens{2068, 7586});
}

TEST_CASE("a held-out split too small for one sample names the split, in every format",
          "[data][loader]") {
  // 100 tokens in one llm.c shard; a Megatron set of 10 documents of 10 tokens.
  std::vector<int32_t> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 0);
  fsdp::data::write_llmc_shard(scratch_path("split_tokens.bin"), tokens.data(), tokens.size());
  fsdp::data::MegatronWriter writer(scratch_path("split_docs"));
  for (int d = 0; d < 10; ++d) writer.add_document(tokens.data() + 10 * d, 10);
  writer.finish();

  for (const DataFormat format : {DataFormat::llmc, DataFormat::megatron}) {
    const bool llmc = format == DataFormat::llmc;
    DataSpec spec;
    spec.format = format;
    spec.path = scratch_path(llmc ? "split_tokens.bin" : "split_docs");
    spec.split = DataSplit::tail;
    spec.holdout_fraction = 0.1;  // 10 tokens, or 1 document of 10 tokens
    spec.label = "validation split (the last held_out = 0.1)";
    try {
      DataLoader loader(spec, 1, 16, 0, 1, 0);
      FAIL("a split of 10 tokens gave samples of 17");
    } catch (const fsdp::DataError& e) {
      const std::string m = e.what();
      CHECK_THAT(m, Catch::Contains("validation split (the last held_out = 0.1) of "));
      CHECK_THAT(m, Catch::Contains(spec.path));
      CHECK_THAT(m, Catch::Contains(llmc ? "(tokens [90, 100) of 100): 10 tokens are too few"
                                         : "(documents [9, 10) of 10): 10 tokens are too few"));
    }
  }
}
