// metadata.json of a checkpoint: parsed and checked (keys, types, files, tensors, every
// parameter's pieces covering it exactly once). Version 2 metadata carries its own SHA-256,
// which random edits break at once; so each input is also tried resealed (its checksum
// recomputed), which lets the fuzzer reach every check behind it.
// Property: accepted metadata written back out parses to the same text.
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/metadata.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

void parse_and_round_trip(const std::string& text) {
  using namespace fsdp;
  checkpoint::CheckpointMetadata m;
  try {
    m = checkpoint::CheckpointMetadata::parse(text, "metadata.json");
  } catch (const Error&) {
    return;
  }
  const std::string written = m.to_json();
  std::string rewritten;
  try {
    rewritten = checkpoint::CheckpointMetadata::parse(written, "written.json").to_json();
  } catch (const Error&) {
    fuzz::property_failed("accepted metadata, written back out, does not parse");
  }
  if (rewritten != written) fuzz::property_failed("accepted metadata does not round-trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fsdp::fuzz::bytes_of(data, size));
  parse_and_round_trip(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("metadata_sha256")) {
    j.erase("metadata_sha256");
    j["metadata_sha256"] = fsdp::checkpoint::sha256_hex(j.dump(1));
    parse_and_round_trip(j.dump(1));
  }
  return 0;
}
