// The safetensors reader and writer: round trips of every dtype, streaming writes, slices,
// and one test per kind of malformed file, each checking that the error names the file
// and the tensor.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/test_support.h"

namespace fsdp::checkpoint {
namespace {

std::string scratch(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      (root ? std::filesystem::path(root) : std::filesystem::temp_directory_path()) /
      "fsdp_safetensors_test";
  std::filesystem::create_directories(dir);
  const std::filesystem::path p = dir / name;
  std::filesystem::remove(p);
  return p.string();
}

// A file of: the 8-byte length of `header`, `header`, then `data_bytes` bytes.
std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = scratch(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(char(i & 0xff));
  return path;
}

// Checks that opening `path` throws CheckpointError mentioning the file and every `part`.
void expect_bad(const std::string& path, const std::vector<std::string>& parts) {
  try {
    SafetensorsReader r(path);
    FAIL("no error for " << path);
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find(path) != std::string::npos);
    for (const std::string& p : parts) CHECK(msg.find(p) != std::string::npos);
  }
}

TEST_CASE("safetensors round-trips every dtype, metadata, scalars and empty tensors",
          "[checkpoint][safetensors]") {
  Context ctx;
  const std::string path = scratch("round_trip.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::vector<double> vals{1.5, -2.25, 3, 0, 7, -8};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::i32,
                  DType::u16, DType::u8}) {
    std::vector<double> v = vals;
    if (t == DType::u16 || t == DType::u8)
      for (double& x : v) x = std::abs(std::floor(x));
    tensors.emplace_back(std::string("t_") + dtype_name(t),
                         ops::from_vector(ctx, v, Shape{2, 3}, t));
  }
  // A transposed (non-contiguous) view is written in its logical order.
  Tensor base = ops::from_vector(ctx, {1, 2, 3, 4, 5, 6}, Shape{2, 3}, DType::f32);
  tensors.emplace_back("transposed", base.transpose(0, 1));
  tensors.emplace_back("scalar", ops::from_vector(ctx, {42}, Shape{}, DType::f32));
  tensors.emplace_back("empty", ctx.empty(Shape{0, 4}, DType::f32));
  save_safetensors(ctx, path, tensors, {{"format", "pt"}, {"quote\"d", "line\nbreak"}});

  SafetensorsReader r(path);
  CHECK(r.metadata().at("format") == "pt");
  CHECK(r.metadata().at("quote\"d") == "line\nbreak");
  CHECK(r.entries().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(r.contains(name));
    const SafetensorsEntry& e = r.entry(name);
    CHECK(e.dtype == t.dtype());
    CHECK(e.shape == t.shape());
    const Tensor back = r.load(ctx, name);
    CHECK(ops::to_vector<double>(ctx, ops::cast(ctx, back, DType::f64)) ==
          ops::to_vector<double>(ctx, ops::cast(ctx, t, DType::f64)));
  }
  CHECK(r.entry("t_bf16").dtype == DType::bf16);
  CHECK(ops::to_vector<float>(ctx, r.load(ctx, "transposed")) ==
        std::vector<float>{1, 4, 2, 5, 3, 6});
  // The header is padded so the data section is 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  CHECK(len[0] % 8 == 0);
}

TEST_CASE("the streaming writer takes tensors in pieces, in declaration order",
          "[checkpoint][safetensors]") {
  const std::string path = scratch("stream.safetensors");
  const std::vector<float> a{1, 2, 3, 4};
  const std::vector<int32_t> b{7, 8};
  {
    SafetensorsWriter w(path);
    w.declare("a", DType::f32, Shape{4});
    w.declare("b", DType::i32, Shape{2});
    CHECK_THROWS_AS(w.declare("a", DType::f32, Shape{1}), ValueError);
    CHECK_THROWS_AS(w.write("b", b.data(), 8), ValueError);  // "a" comes first
    w.write("a", a.data(), 8);
    w.write("a", a.data() + 2, 8);
    CHECK_THROWS_AS(w.write("b", b.data(), 12), ValueError);  // more than b holds
    CHECK_FALSE(std::filesystem::exists(path));  // only at finish()
    w.write("b", b.data(), 8);
    w.finish();
  }
  SafetensorsReader r(path);
  Context ctx;
  CHECK(ops::to_vector<float>(ctx, r.load(ctx, "a")) == a);
  CHECK(ops::to_vector<int32_t>(ctx, r.load(ctx, "b")) == b);
  // A slice of a tensor alone.
  float two[2];
  r.read_bytes("a", 4, two, 8);
  CHECK(two[0] == 2);
  CHECK(two[1] == 3);
  CHECK_THROWS_AS(r.read_bytes("a", 12, two, 8), IndexError);
  CHECK_THROWS_AS(r.entry("c"), CheckpointError);
}

TEST_CASE("an unfinished writer leaves no file behind", "[checkpoint][safetensors]") {
  const std::string path = scratch("unfinished.safetensors");
  {
    SafetensorsWriter w(path);
    w.declare("a", DType::f32, Shape{2});
    const float x = 1;
    w.write("a", &x, 4);
    CHECK_THROWS_AS(w.finish(), ValueError);
  }
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("malformed safetensors files raise errors naming the file and tensor",
          "[checkpoint][safetensors]") {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  SECTION("truncated before the header length") {
    const std::string path = scratch("short.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    expect_bad(path, {"truncated"});
  }
  SECTION("header longer than the file") {
    const std::string path = scratch("long_header.safetensors");
    {
      std::ofstream out(path, std::ios::binary);
      const char len[8] = {100, 0, 0, 0, 0, 0, 0, 0};
      out.write(len, 8);
      out << "{}";
    }
    expect_bad(path, {"truncated"});
  }
  SECTION("data section truncated") {
    expect_bad(raw_file("truncated_data.safetensors", "{" + ok_entry + "}", 5),
               {"\"w\"", "out of range"});
  }
  SECTION("not JSON") {
    expect_bad(raw_file("not_json.safetensors", "{\"w\":", 0), {"header"});
  }
  SECTION("unknown dtype") {
    expect_bad(raw_file("dtype.safetensors",
                        R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
               {"\"w\"", "F8_E4M3"});
  }
  SECTION("bytes do not match dtype and shape") {
    expect_bad(raw_file("size.safetensors",
                        R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               {"\"w\"", "needs 12"});
  }
  SECTION("overlapping tensors") {
    expect_bad(raw_file("overlap.safetensors",
                        "{" + ok_entry +
                            R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12),
               {"overlap", "\"v\"", "\"w\""});
  }
  SECTION("a hole between tensors") {
    expect_bad(raw_file("hole.safetensors",
                        "{" + ok_entry +
                            R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                        16),
               {"hole", "\"v\""});
  }
  SECTION("trailing bytes") {
    expect_bad(raw_file("trailing.safetensors", "{" + ok_entry + "}", 12), {"after the last"});
  }
  SECTION("offsets running backwards") {
    expect_bad(raw_file("backwards.safetensors",
                        R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
               {"\"w\"", "backwards"});
  }
  SECTION("duplicate tensor") {
    expect_bad(raw_file("duplicate.safetensors", "{" + ok_entry + "," + ok_entry + "}", 8),
               {"duplicate", "w"});
  }
  SECTION("missing and unknown fields") {
    expect_bad(raw_file("missing.safetensors", R"({"w":{"dtype":"F32","shape":[2]}})", 8),
               {"\"w\"", "data_offsets"});
    expect_bad(raw_file("unknown.safetensors",
                        R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
               {"\"w\"", "unknown field"});
  }
  SECTION("negative and fractional numbers") {
    expect_bad(raw_file("negative.safetensors",
                        R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
               {"negative"});
    expect_bad(raw_file("fraction.safetensors",
                        R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
               {"non-integer"});
  }
  SECTION("metadata that is not strings") {
    expect_bad(raw_file("metadata.safetensors", R"({"__metadata__":{"step":3}})", 0),
               {"__metadata__", "step"});
  }
}

TEST_CASE("a missing file is an IoError naming it", "[checkpoint][safetensors]") {
  const std::string path = scratch("does_not_exist.safetensors");
  try {
    SafetensorsReader r(path);
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find(path) != std::string::npos);
  }
}

TEST_CASE("files written elsewhere with spaces and escapes in the header are read",
          "[checkpoint][safetensors]") {
  // Hand-written the way other writers may lay a header out: whitespace, \u escapes.
  const std::string path = raw_file(
      "foreign.safetensors",
      "{ \"__metadata__\" : { \"k\" : \"\\u00e9\" } ,\n \"a\\/b\" : { \"shape\" : [ 2 ] , "
      "\"dtype\" : \"U8\" , \"data_offsets\" : [ 0 , 2 ] } }    ",
      2);
  SafetensorsReader r(path);
  CHECK(r.metadata().at("k") == "\xc3\xa9");
  REQUIRE(r.contains("a/b"));
  CHECK(r.entry("a/b").shape == Shape{2});
}

}  // namespace
}  // namespace fsdp::checkpoint
