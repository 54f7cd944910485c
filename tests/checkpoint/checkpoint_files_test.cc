// The pieces under a checkpoint: SHA-256 against the standard's test vectors, per-tensor
// digests, atomic file replacement, metadata.json round trips and names.
#include <filesystem>
#include <functional>
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
  // Nesting thousands of levels deep is refused before parsing, naming the file.
  std::string deep = m.to_json();
  deep.insert(1, "\"x\": " + std::string(5000, '[') + std::string(5000, ']') + ",");
  CHECK_THROWS_AS(CheckpointMetadata::parse(deep, "m.json"), CheckpointError);
  CHECK_THROWS_WITH(CheckpointMetadata::parse(deep, "m.json"),
                    Contains("m.json:1:") && Contains("JSON nested deeper than 128 levels"));
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

// Two files of EP2 over 2 ranks (ZeRO-3: the dense unit sharded over both, the experts unit
// over one rank each): file 1 holds dense shard 1 but experts shard 0 of expert-parallel rank
// 1, so its expert piece is at offset 0 only if the experts unit is read by expert_shard_rank.
CheckpointMetadata expert_parallel_metadata() {
  CheckpointMetadata m;
  m.strategy = "optim_grads_params";
  m.world_size = 2;
  m.shard_size = 2;
  m.expert_parallel = 2;
  m.expert_shard_size = 1;
  m.mesh = "dp_outer=1 x dp_shard=1 x cp=1 x ep=2 x tp=1";
  m.shard_block = 128;
  m.units = {{"h.0", 10, 256, 128, {{"w", Shape{2, 5}, true, 0, 10}}},
             {"h.0.experts", 4, 128, 128, {{"e", Shape{1, 4}, true, 0, 4}}, /*experts=*/true}};
  const Shape e{2, 4};
  m.params = {{"w", Shape{2, 5}, "h.0", {{0, 0, 0, 10}}},
              {"e", e, "h.0.experts", {{0, 0, 0, 4}, {1, 0, 4, 4}}, {}, {{e, 0, {{0, 1}}}, {e, 0, {{1, 2}}}}}};
  m.buffers = {{"h.0.mlp.expert_bias", Shape{2}, 0}};
  FileRecord f0{"shard_00000_of_00002.safetensors", 0, 1234, "aa", {}};
  FileRecord f1{"shard_00001_of_00002.safetensors", 1, 1234, "bb", {}};
  f1.ep_rank = 1;
  for (FileRecord* f : {&f0, &f1})
    f->tensors = {{"main/h.0", DType::f32, 128, "1"}, {"main/h.0.experts", DType::f32, 128, "2"}};
  f0.tensors.push_back({"buffer/h.0.mlp.expert_bias", DType::f32, 2, "3"});
  m.files = {f0, f1};
  return m;
}

TEST_CASE("expert-parallel metadata round-trips and names what is inconsistent", "[checkpoint]") {
  const CheckpointMetadata m = expert_parallel_metadata();
  const CheckpointMetadata back = CheckpointMetadata::parse(m.to_json(), "m.json");
  CHECK(back.to_json() == m.to_json());
  CHECK(back.version == 4);
  CHECK(back.expert_parallel == 2);
  CHECK(back.expert_shard_size == 1);
  CHECK(back.units[1].experts);
  CHECK_FALSE(back.units[0].experts);
  REQUIRE(back.params[1].ep_slices.size() == 2);
  CHECK(back.params[1].ep_slices[1].ranges == std::vector<std::pair<int64_t, int64_t>>{{1, 2}});
  CHECK(back.files[1].ep_rank == 1);
  CHECK(back.files[1].expert_shard_rank == 0);
  REQUIRE(back.find_buffer("h.0.mlp.expert_bias") != nullptr);
  CHECK(back.find_buffer("h.0.mlp.expert_bias")->shape == Shape{2});

  auto error = [&](const std::function<void(CheckpointMetadata&)>& edit) {
    CheckpointMetadata c = m;
    edit(c);
    try {
      CheckpointMetadata::parse(c.to_json(), "m.json");
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    FAIL("no CheckpointError");
    return std::string();
  };
  CHECK_THAT(error([](auto& c) { c.params[1].ep_slices.clear(); }),
             Contains("m.json: parameters.e: is in experts unit \"h.0.experts\" but has no ep_slices"));
  CHECK_THAT(error([](auto& c) { c.units[1].experts = false; }),
             Contains("parameters.e: has ep_slices but its unit \"h.0.experts\" is not an experts unit"));
  CHECK_THAT(error([](auto& c) { c.params[1].ep_slices.pop_back(); }),
             Contains("parameters.e.ep_slices: 1 slices for 2 expert-parallel ranks"));
  CHECK_THAT(error([](auto& c) { c.params[1].tp_slices = c.params[1].ep_slices; }),
             Contains("parameters.e: has both tp_slices and ep_slices"));
  // File 1 said to hold rank 0's experts: its piece is not part of them.
  CHECK_THAT(error([](auto& c) { c.files[1].ep_rank = 0; }),
             Contains("parameters.e.pieces[1]: elements [4, 8) are not one run of the slice of "
                      "expert-parallel rank 0"));
  CHECK_THAT(error([](auto& c) { c.files[1].ep_rank = 2; }), Contains("m.json: files[1].ep_rank: 2 is not a rank of 2"));
  CHECK_THAT(error([](auto& c) { c.files[1].shard_rank = 2; }), Contains("files[1].shard_rank: 2 is not a rank of 2"));
  // Experts sharded over two ranks, file 1 the second's: its piece would be 128 further on.
  CHECK_THAT(error([](auto& c) {
               c.expert_shard_size = 2;
               c.files[1].expert_shard_rank = 1;
             }),
             Contains("parameters.e.pieces[1]: tensor offset 0 disagrees with the layout, which puts "
                      "element 4 of the parameter at -128 in file shard_00001_of_00002.safetensors"));
  CHECK_THAT(error([](auto& c) { c.buffers[0].file = 1; }),
             Contains("buffers.h.0.mlp.expert_bias: file shard_00001_of_00002.safetensors lists no tensor "
                      "\"buffer/h.0.mlp.expert_bias\""));
  CHECK_THAT(error([](auto& c) { c.buffers[0].shape = Shape{3}; }),
             Contains("buffers.h.0.mlp.expert_bias: file shard_00000_of_00002.safetensors tensor "
                      "\"buffer/h.0.mlp.expert_bias\" has 2 elements for shape (3,)"));
  CHECK_THAT(error([](auto& c) { c.buffers[0].file = 7; }), Contains("buffers.h.0.mlp.expert_bias.file: file index 7"));

  // A version 4 text without a key of version 4 is refused naming it; version 3 had none.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(m.to_json());
  j["layout"].erase("expert_parallel");
  j.erase("metadata_sha256");
  j["metadata_sha256"] = checkpoint::sha256_hex(j.dump(1));
  CHECK_THROWS_WITH(CheckpointMetadata::parse(j.dump(1), "m.json"),
                    Contains("m.json: layout.expert_parallel: missing"));
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
