// The pieces under a checkpoint: SHA-256 against the standard's test vectors, per-tensor
// digests, atomic file replacement, metadata.json round trips and names.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/file_digest.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/sha256.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::checkpoint;
using Catch::Matchers::Contains;

TEST_CASE("SHA-256 gives the FIPS 180-4 test vectors, however the input is split", "[checkpoint]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(sha256_hex(two_blocks) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  CHECK(sha256_hex(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  for (size_t piece : {1, 7, 63, 64, 65, 1000}) {
    Sha256 h;
    for (size_t i = 0; i < million.size(); i += piece) h.update(million.data() + i, std::min(piece, million.size() - i));
    CHECK(h.hex_digest() == sha256_hex(million));
  }
}

TEST_CASE("a safetensors file's digest covers the file and each tensor", "[checkpoint]") {
  const std::string dir = testing::shared_scratch_dir("digest");
  const std::string path = dir + "/t.safetensors";
  Context ctx;
  Tensor a = ctx.empty_host(Shape{3}, DType::f32);
  Tensor b = ctx.empty_host(Shape{2, 2}, DType::i32);
  for (int i = 0; i < 3; ++i) a.data<float>()[i] = float(i) + 0.5f;
  for (int i = 0; i < 4; ++i) b.data<int32_t>()[i] = i * 7;
  save_safetensors(ctx, path, {{"a", a}, {"b", b}});
  const FileDigest d = digest_safetensors_file(path);
  CHECK(d.bytes == std::filesystem::file_size(path));
  CHECK(d.sha256 == sha256_hex(read_text_file(path)));
  CHECK(d.tensors.at("a") == sha256_hex(std::string(static_cast<const char*>(a.data_ptr()), 12)));
  CHECK(d.tensors.at("b") == sha256_hex(std::string(static_cast<const char*>(b.data_ptr()), 16)));
}

TEST_CASE("write_file_atomically replaces a file whole and leaves no temporary", "[checkpoint]") {
  const std::string dir = testing::shared_scratch_dir("atomic");
  const std::string path = dir + "/latest";
  write_file_atomically(path, "step_000001\n");
  write_file_atomically(path, "step_000002\n");
  CHECK(read_text_file(path) == "step_000002\n");
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  CHECK(file_size_or_missing(path) == 12);
  CHECK(file_size_or_missing(dir + "/nothing") == -1);
  CHECK(file_size_or_missing(dir) == -1);  // a directory is not a file
  CHECK_THROWS_AS(write_file_atomically(dir + "/no/such/dir/f", "x"), IoError);
}

TEST_CASE("metadata.json round-trips and names what is wrong", "[checkpoint]") {
  CheckpointMetadata m;
  m.step = 42;
  m.consumed_samples = 336;
  m.consumed_tokens = 5376;
  m.init_seed = 3;
  m.data_seed = 7;
  m.strategy = "optim_grads_params";
  m.world_size = 2;
  m.shard_size = 2;
  m.mesh = "dp_outer=1 x dp_shard=2";
  m.plan_hash = 0xfedcba9876543210ull;
  m.shard_block = 128;
  m.units = {{"root", 10, 256, 128, {{"w", Shape{2, 5}, true, 0, 10}}}};
  m.optimizer = "adamw";
  m.optimizer_steps = 42;
  m.moments_dtype = DType::bf16;
  m.params = {{"w", Shape{2, 5}, "root", {{0, 0, 0, 10}}}};
  FileRecord f0{"shard_00000_of_00002.safetensors", 0, 1234, "aa", {}};
  FileRecord f1{"shard_00001_of_00002.safetensors", 1, 1234, "bb", {}};
  for (FileRecord* f : {&f0, &f1}) {
    f->tensors = {{"main/root", DType::f32, 128, "1"}, {"exp_avg/root", DType::bf16, 128, "2"},
                  {"exp_avg_sq/root", DType::bf16, 128, "3"}};
  }
  m.files = {f0, f1};
  m.recipe_json = R"({"run": {"seed": 3}})";

  const CheckpointMetadata back = CheckpointMetadata::parse(m.to_json(), "m.json");
  CHECK(back.to_json() == m.to_json());
  CHECK(back.plan_hash == m.plan_hash);
  CHECK(back.consumed_samples == 336);
  CHECK(*back.moments_dtype == DType::bf16);
  CHECK(back.units[0].params[0].numel == 10);
  CHECK(back.state_kinds() == std::vector<std::string>{"main", "exp_avg", "exp_avg_sq"});

  auto broken = [&](const std::function<void(CheckpointMetadata&)>& edit) {
    CheckpointMetadata c = m;
    edit(c);
    return c.to_json();
  };
  CHECK_THROWS_WITH(CheckpointMetadata::parse(broken([](auto& c) { c.params[0].pieces[0].numel = 9; }), "m.json"),
                    Contains("m.json: parameters.w: the pieces cover 9 elements of 10"));
  CHECK_THROWS_WITH(CheckpointMetadata::parse(broken([](auto& c) { c.params[0].pieces[0].file = 5; }), "m.json"),
                    Contains("file index 5"));
  // An offset the layout does not give (one digit changed), and one past the tensor.
  CHECK_THROWS_WITH(
      CheckpointMetadata::parse(broken([](auto& c) { c.params[0].pieces[0].tensor_offset = 6; }), "m.json"),
      Contains("tensor offset 6 disagrees with the layout, which puts element 0 of the parameter at 0"));
  CHECK_THROWS_WITH(
      CheckpointMetadata::parse(broken([](auto& c) { c.files[0].tensors[0].numel = 5; }), "m.json"),
      Contains("outside tensor \"main/root\""));
  // A file index past 2^32 does not wrap around to file 0.
  std::string huge_index = m.to_json();
  {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(huge_index);
    j["parameters"]["w"]["pieces"][0][0] = int64_t(1) << 32;
    j.erase("metadata_sha256");
    j["metadata_sha256"] = checkpoint::sha256_hex(j.dump(1));
    huge_index = j.dump(1);
  }
  CHECK_THROWS_WITH(CheckpointMetadata::parse(huge_index, "m.json"), Contains("file index 4294967296"));
  CHECK_THROWS_WITH(CheckpointMetadata::parse(broken([](auto& c) { c.files[0].tensors.pop_back(); }), "m.json"),
                    Contains("lists no tensor \"exp_avg_sq/root\""));
  CHECK_THROWS_WITH(CheckpointMetadata::parse(broken([](auto& c) { c.files[1].name = "../x"; }), "m.json"),
                    Contains("not a plain file name"));
  CHECK_THROWS_WITH(CheckpointMetadata::parse(broken([](auto& c) { c.version = 9; }), "m.json"),
                    Contains("version"));
  // Any edit of the text shows in its checksum, before anything else is looked at.
  std::string no_step = m.to_json();
  no_step.replace(no_step.find("\"step\""), 6, "\"stap\"");
  CHECK_THROWS_WITH(CheckpointMetadata::parse(no_step, "m.json"),
                    Contains("m.json: metadata_sha256: does not match the metadata's text"));
  std::string one_digit = m.to_json();
  const std::string samples = "\"consumed_samples\": 336";
  one_digit.replace(one_digit.find(samples), samples.size(), "\"consumed_samples\": 337");
  CHECK_THROWS_WITH(CheckpointMetadata::parse(one_digit, "m.json"), Contains("metadata_sha256"));
  // A missing key of a whole (resealed) text is named.
  {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(m.to_json());
    j.erase("step");
    j.erase("metadata_sha256");
    j["metadata_sha256"] = checkpoint::sha256_hex(j.dump(1));
    CHECK_THROWS_WITH(CheckpointMetadata::parse(j.dump(1), "m.json"), Contains("m.json: step: missing"));
  }
  CHECK_THROWS_AS(CheckpointMetadata::parse("[1, 2", "m.json"), CheckpointError);
}

TEST_CASE("step directory and shard file names", "[checkpoint]") {
  CHECK(step_directory_name(100) == "step_000100");
  CHECK(step_directory_name(12345678) == "step_12345678");
  CHECK(step_of_directory_name("step_000100") == 100);
  CHECK(step_of_directory_name("step_") == -1);
  CHECK(step_of_directory_name("step_12a") == -1);
  CHECK(step_of_directory_name(".tmp_step_000100") == -1);
  CHECK(shard_file_name(3, 8) == "shard_00003_of_00008.safetensors");
}
