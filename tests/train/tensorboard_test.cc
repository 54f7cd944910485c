// TensorBoard event files read back through their framing (both CRCs checked, with a CRC32C
// written here bit by bit, independently of the writer's table) and their protobuf fields
// decoded by a small reader of the wire format.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/recipe.h"
#include "runtime/train/tensorboard.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

template <typename T>
T read_le(const std::string& s, size_t at) {
  REQUIRE(at + sizeof(T) <= s.size());
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

// The records of an event file; fails the test on a bad length or CRC.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    const uint64_t length = read_le<uint64_t>(file, at);
    CHECK(read_le<uint32_t>(file, at + 8) == masked(crc32c_bitwise(file.substr(at, 8))));
    REQUIRE(at + 12 + length + 4 <= file.size());
    const std::string data = file.substr(at + 12, length);
    CHECK(read_le<uint32_t>(file, at + 12 + length) == masked(crc32c_bitwise(data)));
    records.push_back(data);
    at += 12 + length + 4;
  }
  return records;
}

// One field of a protobuf message: its number, wire type and value (the integer of a varint,
// the bytes of a length-delimited or fixed-size field).
struct Field {
  int number = 0;
  int wire_type = 0;
  uint64_t varint = 0;
  std::string bytes;
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    REQUIRE(shift < 64);
    const auto byte = static_cast<unsigned char>(s[at++]);
    v |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
}

std::vector<Field> decode(const std::string& message) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < message.size()) {
    Field f;
    const uint64_t key = read_varint(message, at);
    f.number = int(key >> 3);
    f.wire_type = int(key & 7);
    switch (f.wire_type) {
      case 0: f.varint = read_varint(message, at); break;
      case 1: f.bytes = message.substr(at, 8); at += 8; break;
      case 5: f.bytes = message.substr(at, 4); at += 4; break;
      case 2: {
        const uint64_t n = read_varint(message, at);
        REQUIRE(at + n <= message.size());
        f.bytes = message.substr(at, n);
        at += n;
        break;
      }
      default: FAIL("unexpected wire type " << f.wire_type);
    }
    REQUIRE(at <= message.size());
    fields.push_back(f);
  }
  return fields;
}

const Field* find(const std::vector<Field>& fields, int number) {
  for (const Field& f : fields)
    if (f.number == number) return &f;
  return nullptr;
}

struct Scalar {
  int64_t step;
  std::string tag;
  float value;
};

// An Event that holds one scalar summary value.
Scalar decode_scalar_event(const std::string& record) {
  const std::vector<Field> event = decode(record);
  const Field* wall_time = find(event, 1);
  REQUIRE(wall_time);
  CHECK(wall_time->wire_type == 1);
  CHECK(read_le<double>(wall_time->bytes, 0) > 1.5e9);  // seconds since 1970, after 2017
  const Field* step = find(event, 2);
  REQUIRE(step);
  const Field* summary = find(event, 5);
  REQUIRE(summary);
  REQUIRE(summary->wire_type == 2);
  const std::vector<Field> values = decode(summary->bytes);
  REQUIRE(values.size() == 1);
  CHECK(values[0].number == 1);
  const std::vector<Field> value = decode(values[0].bytes);
  const Field* tag = find(value, 1);
  const Field* simple_value = find(value, 2);
  REQUIRE(tag);
  REQUIRE(simple_value);
  CHECK(simple_value->wire_type == 5);
  return {int64_t(step->varint), tag->bytes, read_le<float>(simple_value->bytes, 0)};
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(e.path().string());
  return files;
}

}  // namespace

TEST_CASE("crc32c matches the published check value and TensorFlow's mask", "[train]") {
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(crc32c_bitwise(digits) == 0xE3069283u);
  CHECK(masked_crc32c(digits.data(), digits.size()) == masked(0xE3069283u));
  CHECK(crc32c(nullptr, 0) == 0u);
}

TEST_CASE("TensorBoard writer: file_version first, then scalar events", "[train]") {
  const std::string dir = testing::scratch_dir("tensorboard");
  std::string path;
  {
    TensorBoardWriter writer(dir, "tiny");
    path = writer.path();
    writer.add_scalar("train/loss", 1, 10.84);
    writer.add_scalar("train/loss", 2, 9.5);
    writer.add_scalar("val/loss", 2, 9.75);
    writer.add_scalar("train/lr", 300, 6e-4);
    writer.flush();
  }
  // One file in DIR/RUN_NAME, as TensorBoard looks for runs.
  REQUIRE(event_files(dir + "/tiny") == std::vector<std::string>{path});

  const std::vector<std::string> records = read_records(path);
  REQUIRE(records.size() == 5);
  const std::vector<Field> first = decode(records[0]);
  const Field* version = find(first, 3);
  REQUIRE(version);
  CHECK(version->bytes == "brain.Event:2");
  CHECK(find(first, 5) == nullptr);

  const Scalar a = decode_scalar_event(records[1]);
  CHECK(a.step == 1);
  CHECK(a.tag == "train/loss");
  CHECK(a.value == 10.84f);
  const Scalar b = decode_scalar_event(records[3]);
  CHECK(b.step == 2);
  CHECK(b.tag == "val/loss");
  CHECK(b.value == 9.75f);
  const Scalar c = decode_scalar_event(records[4]);
  CHECK(c.step == 300);  // a varint of two bytes
  CHECK(c.tag == "train/lr");
  CHECK(c.value == 6e-4f);
}

TEST_CASE("TensorBoard writer: a logged step's metrics, optional ones only when present",
          "[train]") {
  const std::string dir = testing::scratch_dir("tensorboard_metrics");
  std::string path;
  {
    TensorBoardWriter writer(dir, "run");
    path = writer.path();
    StepMetrics m;
    m.step = 50;
    m.loss = 6.85;
    m.lr = 9.4e-4;
    m.grad_norm = 0.7;
    m.tokens_per_sec = 559;
    m.step_time_s = 0.9;
    m.mem_peak_bytes = int64_t(3) << 29;  // 1.5 GiB
    writer.add_step_metrics(m);
    m.step = 100;
    m.val_loss = 6.5;
    m.mfu = 0.41;
    m.update_norms["h.*.attn.qkv.weight"] = 0.01;
    m.moe_aux_loss = 2.5;
    m.moe_z_loss = 0.25;
    m.moe_max_load = 1.5;
    writer.add_step_metrics(m);
  }
  const std::vector<std::string> records = read_records(path);
  std::vector<Scalar> scalars;
  for (size_t i = 1; i < records.size(); ++i) scalars.push_back(decode_scalar_event(records[i]));
  auto value_of = [&](int64_t step, const std::string& tag) -> std::optional<float> {
    for (const Scalar& s : scalars)
      if (s.step == step && s.tag == tag) return s.value;
    return std::nullopt;
  };
  CHECK(value_of(50, "train/loss") == 6.85f);
  CHECK(value_of(50, "train/memory_peak_gib") == 1.5f);
  CHECK(value_of(50, "train/tokens_per_sec") == 559.0f);
  CHECK_FALSE(value_of(50, "val/loss"));
  CHECK_FALSE(value_of(50, "train/mfu"));
  CHECK(value_of(100, "val/loss") == 6.5f);
  CHECK(value_of(100, "train/mfu") == 0.41f);
  CHECK(value_of(100, "update_norm/h.*.attn.qkv.weight") == 0.01f);
  CHECK_FALSE(value_of(50, "moe/aux_loss"));
  CHECK(value_of(100, "moe/aux_loss") == 2.5f);
  CHECK(value_of(100, "moe/z_loss") == 0.25f);
  CHECK(value_of(100, "moe/max_load") == 1.5f);
}

TEST_CASE("TensorBoard writer: a directory it cannot create is an IoError naming it",
          "[train]") {
  const std::string dir = testing::scratch_dir("tensorboard_blocked");
  std::ofstream(dir + "/file") << "not a directory";
  try {
    TensorBoardWriter writer(dir + "/file", "run");
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Catch::Contains(dir + "/file"));
  }
}

TEST_CASE("A run with logger.tensorboard_dir writes each logged step's loss, and its step "
          "lines estimate the time left", "[train]") {
  const std::string dir = testing::scratch_dir("tensorboard_trainer");
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 5 + i / 7) % 96);
  data::write_llmc_shard(dir + "/tokens.bin", tokens.data(), tokens.size());
  const std::string json = R"({
    "model": {"family": "gpt2", "n_layer": 1, "n_head": 2, "d_model": 16, "vocab_size": 96,
              "padded_vocab_size": 128, "seq_length": 8},
    "dataset": {"type": "llmc", "val_path": null, "val_fraction": 0},
    "train": {"train_iters": 4, "micro_batch_size": 1, "global_batch_size": 1,
              "eval_interval": 0, "eval_iters": 0},
    "dist": {"device": "cpu"},
    "checkpoint": {"save": null, "load": null},
    "logger": {"log_interval": 1}
  })";
  Recipe recipe = parse_recipe(json, {"dataset.train_path=" + dir + "/tokens.bin",
                                      "run.output_dir=" + dir + "/run", "run.name=tiny",
                                      "logger.tensorboard_dir=" + dir + "/tb"}, "tensorboard_test");
  TrainerOptions options;
  options.print_sample = false;
  std::FILE* lines = std::tmpfile();
  REQUIRE(lines);
  options.out = lines;
  TrainResult result = Trainer(recipe, options).run();
  REQUIRE(result.losses.size() == 4);

  // Every step's line but the last says how long is left; the last has nothing left.
  std::rewind(lines);
  std::string printed;
  for (int c = std::fgetc(lines); c != EOF; c = std::fgetc(lines)) printed += char(c);
  std::fclose(lines);
  for (int step = 1; step <= 4; ++step) {
    const size_t at = printed.find("step " + std::to_string(step) + "/4 ");
    REQUIRE(at != std::string::npos);
    const std::string line = printed.substr(at, printed.find('\n', at) - at);
    INFO(line);
    CHECK(line.find(" elapsed") != std::string::npos);
    CHECK((line.find(" | eta ") != std::string::npos) == (step < 4));
  }

  const std::vector<std::string> files = event_files(dir + "/tb/tiny");
  REQUIRE(files.size() == 1);
  const std::vector<std::string> records = read_records(files[0]);
  std::vector<float> losses;
  for (size_t i = 1; i < records.size(); ++i) {
    const Scalar s = decode_scalar_event(records[i]);
    if (s.tag == "train/loss") {
      CHECK(s.step == int64_t(losses.size()) + 1);
      losses.push_back(s.value);
    }
  }
  REQUIRE(losses.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(losses[i] == float(result.losses[i]));
}
