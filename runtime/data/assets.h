// The files fsdp.cpp ships under third_party/ (GPT-2 vocabulary, default text), and how to
// find them from a binary or test that may run from the repository root, from `bazel run`, or
// inside Bazel's runfiles tree.
#pragma once

#include <string>

namespace fsdp::data {

// Paths relative to the repository root.
inline constexpr const char* kGpt2VocabAsset = "third_party/gpt2_tokenizer/encoder.json";
inline constexpr const char* kGpt2MergesAsset = "third_party/gpt2_tokenizer/vocab.bpe";
inline constexpr const char* kDefaultTextAsset = "third_party/text/austen.txt";

// An existing path for `repo_path`. Absolute paths are returned as they are. Relative ones are
// looked up, in order, in the current directory, $BUILD_WORKING_DIRECTORY (where `bazel run`
// was typed), $BUILD_WORKSPACE_DIRECTORY, and the runfiles of the running binary
// ($RUNFILES_DIR, $TEST_SRCDIR, or `argv0`.runfiles). DataError listing every place tried when
// none has it.
std::string locate_asset(const std::string& repo_path, const std::string& argv0 = "");

}  // namespace fsdp::data
