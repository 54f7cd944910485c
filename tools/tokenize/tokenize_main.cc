// tokenize: turns UTF-8 text files (or JSON lines, gzip-compressed or not) into training data
// with the GPT-2 tokenizer, on all cores.
//
//   tokenize [options] --out PREFIX FILES...
//
// llm.c format: PREFIX_train_000000.bin, ... (and PREFIX_val_000000.bin with --val-fraction);
// every document's tokens are preceded by <|endoftext|>, as llm.c's own scripts do. The
// shards are llm.c's GPT-2 kind (uint16 tokens) when the vocabulary fits 16 bits, else its
// Llama 3 kind (uint32), or as --llmc-format says.
// Megatron format: PREFIX.bin/.idx (or PREFIX_train.* and PREFIX_val.*), one sequence per
// document (per sentence of a JSON list of pre-split sentences) with <|endoftext|> appended
// to its last one, and an empty JSON text kept as a document of no sequences, as Megatron-LM's
// preprocess_data.py --append-eod does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/thread_pool.h"
#include "runtime/data/assets.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/data/megatron_indexed.h"
#include "runtime/data/tokenizer.h"
#include "tools/common/numeric_flags.h"
#include "tools/tokenize/input_documents.h"
#include "tools/tokenize/parallel_encode.h"

namespace {

using fsdp::ConfigError;
using fsdp::tools::integer_flag;
using fsdp::tools::number_flag;
namespace data = fsdp::data;

constexpr const char* kUsage = R"(usage: tokenize [options] --out PREFIX FILES...

Tokenizes UTF-8 text files with the GPT-2 byte-level BPE tokenizer and writes them as
training data. Each file is one document (or, with --split-blank-lines, each group of
lines between blank lines); with --json-key, each line of a file is a JSON object and one
document. Gzip-compressed files (FILE.gz, recognized by content) are decompressed. Files
are read and encoded on all cores; the output does not depend on the number of workers.
A progress line (bytes, tokens/s, time left) goes to stderr for jobs longer than 2 s.

options:
  --out PREFIX           output path prefix (required)
  --format llmc|megatron output format (default llmc)
                           llmc:     PREFIX_train_NNNNNN.bin [PREFIX_val_NNNNNN.bin]
                                     llm.c shards, <|endoftext|> before every document
                           megatron: PREFIX.bin/.idx, or PREFIX_train.* and PREFIX_val.*
                                     with --val-fraction; <|endoftext|> after every document
  --val-fraction F       hold out a fraction F in [0, 1) for validation (default 0):
                         the last F of the tokens (llmc) or of the documents (megatron)
  --split-blank-lines    a blank line ends a document (plain text)
  --json-key KEY         inputs are JSON lines; member KEY of each line's object is one
                         document (as Megatron's --json-keys text): a string, or a list
                         of strings (pre-split sentences: one Megatron sequence each,
                         back to back in llm.c shards). As in Megatron, an empty text is
                         an empty document (no sequences); llm.c shards skip it
  --workers N            threads (default: every core this process may use)
  --shard-tokens N       llmc: at most N tokens per shard (default 100000000)
  --llmc-format gpt-2|llama-3
                         llmc: llm.c's GPT-2 shards (magic 20240520, version 1, uint16
                         tokens) or its Llama 3 shards (magic 20240801, version 7, uint32
                         tokens); default gpt-2 when the vocabulary has at most 65536
                         tokens, else llama-3
  --vocab FILE           vocabulary, encoder.json / vocab.json
                         (default third_party/gpt2_tokenizer/encoder.json)
  --merges FILE          merge rules, vocab.bpe / merges.txt
                         (default third_party/gpt2_tokenizer/vocab.bpe)
  -h, --help             show this help

Relative paths are taken from the directory `bazel run` was started in, if any.
Exit status: 0 success, 2 bad arguments, 1 failure while reading or writing.
)";

struct Options {
  std::string out;
  std::string format = "llmc";
  double val_fraction = 0;
  bool split_blank_lines = false;
  uint64_t shard_tokens = 100'000'000;
  std::string llmc_format;  // "gpt-2" | "llama-3"; empty: by the vocabulary's size
  std::string vocab, merges;
  std::string json_key;
  unsigned workers = 0;  // 0: every core
  std::vector<std::string> files;
};

// Paths given on the command line are relative to where the user typed it.
std::string from_user(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (dir == nullptr || path.empty() || path.front() == '/') return path;
  return std::string(dir) + "/" + path;
}

// Returns false when --help was asked for.
bool parse_args(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    if (arg.rfind("--", 0) != 0) {
      opt.files.push_back(from_user(arg));
      continue;
    }
    if (arg == "--split-blank-lines") {
      opt.split_blank_lines = true;
      continue;
    }
    // --flag VALUE or --flag=VALUE
    std::string value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      FSDP_CHECK(i + 1 < argc, ConfigError, arg, " needs a value (see --help)");
      value = argv[++i];
    }
    if (arg == "--out") {
      opt.out = from_user(value);
    } else if (arg == "--format") {
      opt.format = value;
    } else if (arg == "--val-fraction") {
      opt.val_fraction = number_flag(arg, value, 0, 1);  // below 1: checked below
    } else if (arg == "--shard-tokens") {
      opt.shard_tokens = integer_flag<uint64_t>(arg, value, 1, 2147483647);
    } else if (arg == "--llmc-format") {
      FSDP_CHECK(value == "gpt-2" || value == "llama-3", ConfigError, "--llmc-format '", value,
                 "': expected gpt-2 or llama-3");
      opt.llmc_format = value;
    } else if (arg == "--json-key") {
      FSDP_CHECK(!value.empty(), ConfigError, "--json-key needs a member name");
      opt.json_key = value;
    } else if (arg == "--workers") {
      opt.workers = integer_flag<unsigned>(arg, value, 1, 1024);
    } else if (arg == "--vocab") {
      opt.vocab = from_user(value);
    } else if (arg == "--merges") {
      opt.merges = from_user(value);
    } else {
      FSDP_THROW(ConfigError, "unknown option '", arg, "' (see --help)");
    }
  }
  FSDP_CHECK(!opt.out.empty(), ConfigError, "--out PREFIX is required (see --help)");
  FSDP_CHECK(!opt.files.empty(), ConfigError, "no input files (see --help)");
  FSDP_CHECK(opt.format == "llmc" || opt.format == "megatron", ConfigError, "--format '",
             opt.format, "': expected llmc or megatron");
  FSDP_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, ConfigError,
             "--val-fraction must be in [0, 1), got ", opt.val_fraction);
  FSDP_CHECK(opt.json_key.empty() || !opt.split_blank_lines, ConfigError,
             "--split-blank-lines is for plain text; with --json-key each line is a document");
  return true;
}

// Writes tokens [begin, end) of the stream as PREFIX_split_000000.bin, ...
void write_llmc_split(const Options& opt, data::LlmcShardFormat format,
                      const std::vector<int32_t>& stream, uint64_t begin, uint64_t end,
                      const char* split) {
  int shard = 0;
  for (uint64_t first = begin; first < end || shard == 0; first += opt.shard_tokens, ++shard) {
    const uint64_t n = std::min(opt.shard_tokens, end - first);
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "_%s_%06d.bin", split, shard);
    const std::string path = opt.out + suffix;
    data::write_llmc_shard(path, stream.data() + first, n, format);
    std::printf("wrote %s (%llu tokens, %s)\n", path.c_str(), static_cast<unsigned long long>(n),
                data::llmc_format_name(format));
  }
}

using fsdp::tokenize::Documents;
using SentenceIds = std::vector<std::vector<int32_t>>;  // each sentence's ids, in order

// As data::tokenize_documents: every document preceded by <|endoftext|>, its sentences' ids
// back to back; a document without tokens adds nothing.
void write_llmc(const Options& opt, const data::Gpt2Tokenizer& tokenizer, const Documents& docs,
                const SentenceIds& ids) {
  const bool wide = opt.llmc_format.empty() ? tokenizer.vocab_size() > 65536
                                            : opt.llmc_format == "llama-3";
  const auto format = wide ? data::LlmcShardFormat::llama3 : data::LlmcShardFormat::gpt2;
  std::vector<int32_t> stream;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const std::size_t doc_start = stream.size();
    stream.push_back(tokenizer.eot_token());
    for (std::size_t s = docs.first_sentence[d]; s < docs.first_sentence[d + 1]; ++s)
      stream.insert(stream.end(), ids[s].begin(), ids[s].end());
    if (stream.size() == doc_start + 1) stream.pop_back();
  }
  const uint64_t val = static_cast<uint64_t>(opt.val_fraction * double(stream.size()));
  const uint64_t cut = stream.size() - val;
  write_llmc_split(opt, format, stream, 0, cut, "train");
  if (val > 0) write_llmc_split(opt, format, stream, cut, stream.size(), "val");
}

// Documents [begin, end) as Megatron's preprocess_data.py --append-eod writes them: one
// sequence per sentence that has tokens, <|endoftext|> at the end of the last one; a document
// without tokens is kept, with no sequences (and no <|endoftext|>).
void write_megatron_docs(const std::string& prefix, const data::Gpt2Tokenizer& tokenizer,
                         const Documents& docs, const SentenceIds& ids, std::size_t begin,
                         std::size_t end) {
  const auto type = tokenizer.vocab_size() <= 65536 ? data::TokenType::u16 : data::TokenType::i32;
  data::MegatronWriter writer(prefix, type);
  uint64_t tokens = 0;
  std::vector<int32_t> with_eot;
  for (std::size_t d = begin; d < end; ++d) {
    const std::size_t first = docs.first_sentence[d], stop = docs.first_sentence[d + 1];
    std::size_t last = stop;  // the last sentence with tokens, if any
    for (std::size_t s = first; s < stop; ++s)
      if (!ids[s].empty()) last = s;
    for (std::size_t s = first; s < stop; ++s) {
      if (ids[s].empty()) continue;
      const std::vector<int32_t>* sequence = &ids[s];
      if (s == last) {
        with_eot = ids[s];
        with_eot.push_back(tokenizer.eot_token());
        sequence = &with_eot;
      }
      writer.add_sequence(sequence->data(), sequence->size());
      tokens += sequence->size();
    }
    writer.end_document();
  }
  writer.finish();
  std::printf("wrote %s.bin/.idx (%zu documents, %llu tokens)\n", prefix.c_str(), end - begin,
              static_cast<unsigned long long>(tokens));
}

void write_megatron(const Options& opt, const data::Gpt2Tokenizer& tokenizer,
                    const Documents& docs, const SentenceIds& ids) {
  if (opt.val_fraction == 0) {
    write_megatron_docs(opt.out, tokenizer, docs, ids, 0, docs.size());
    return;
  }
  // Whole documents go to validation: at least one, and at least one stays for training.
  FSDP_CHECK(docs.size() >= 2, ConfigError, "--val-fraction with the megatron format needs at "
             "least 2 documents, got ", docs.size(), " (try --split-blank-lines)");
  std::size_t val = static_cast<std::size_t>(opt.val_fraction * double(docs.size()) + 0.5);
  val = std::min(std::max<std::size_t>(val, 1), docs.size() - 1);
  write_megatron_docs(opt.out + "_train", tokenizer, docs, ids, 0, docs.size() - val);
  write_megatron_docs(opt.out + "_val", tokenizer, docs, ids, docs.size() - val, docs.size());
}

int run(int argc, char** argv) {
  Options opt;
  if (!parse_args(argc, argv, opt)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string argv0 = argc > 0 ? argv[0] : "";
  data::Gpt2Tokenizer tokenizer(
      data::locate_asset(opt.vocab.empty() ? data::kGpt2VocabAsset : opt.vocab, argv0),
      data::locate_asset(opt.merges.empty() ? data::kGpt2MergesAsset : opt.merges, argv0));
  const auto start = std::chrono::steady_clock::now();
  const unsigned workers = opt.workers > 0 ? opt.workers : fsdp::host_threads_per_process(1);
  fsdp::tokenize::InputFormat format;
  format.json_key = opt.json_key;
  format.split_blank_lines = opt.split_blank_lines;
  const Documents docs = fsdp::tokenize::read_all_documents(opt.files, format, workers);
  FSDP_CHECK(docs.size() > 0, fsdp::DataError, "the input files hold no text");
  uint64_t bytes = 0;
  for (const auto& sentence : docs.sentences) bytes += sentence.size();
  std::printf("%zu file(s), %zu document(s), %llu bytes, %u worker(s)\n", opt.files.size(),
              docs.size(), static_cast<unsigned long long>(bytes), workers);
  std::fflush(stdout);
  fsdp::tokenize::EncodeOptions encode;
  encode.workers = workers;
  const SentenceIds ids = fsdp::tokenize::encode_documents(tokenizer, docs.sentences, encode);
  uint64_t tokens = 0;
  for (const auto& d : ids) tokens += d.size();
  const double encoded =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (opt.format == "llmc") {
    write_llmc(opt, tokenizer, docs, ids);
  } else {
    write_megatron(opt, tokenizer, docs, ids);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("read and encoded in %.2f s (%.2f MB/s, %.0f tokens/s); done in %.2f s\n", encoded,
              double(bytes) / 1e6 / encoded, double(tokens) / encoded, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fsdp::ConfigError& e) {
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 1;
  }
}
