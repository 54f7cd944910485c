#include "tools/tokenize/parallel_encode.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>

#include "runtime/core/thread_pool.h"
#include "tools/tokenize/progress.h"

namespace fsdp::tokenize {
namespace {

bool is_cut_point(std::string_view text, size_t i) {
  const auto before = static_cast<unsigned char>(text[i - 1]);
  return text[i] == '\n' && before > 0x20 && before < 0x7f;
}

// A piece of work: a part of one document (all of it when small).
struct Piece {
  size_t document;
  std::string_view text;
};

}  // namespace

std::vector<std::string_view> split_for_encoding(std::string_view text, size_t target_bytes) {
  std::vector<std::string_view> pieces;
  size_t begin = 0;
  while (text.size() - begin > target_bytes) {
    size_t cut = begin + std::max<size_t>(target_bytes, 1);
    while (cut < text.size() && !is_cut_point(text, cut)) ++cut;
    if (cut >= text.size()) break;
    pieces.push_back(text.substr(begin, cut - begin));
    begin = cut;
  }
  if (begin < text.size() || pieces.empty()) pieces.push_back(text.substr(begin));
  return pieces;
}

std::vector<std::vector<int32_t>> encode_documents(const data::Gpt2Tokenizer& tokenizer,
                                                   const std::vector<std::string>& documents,
                                                   const EncodeOptions& options) {
  std::vector<Piece> pieces;
  uint64_t total_bytes = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (std::string_view part : split_for_encoding(documents[d], options.piece_bytes))
      pieces.push_back({d, part});
    total_bytes += documents[d].size();
  }

  const unsigned workers = std::max(1u, options.workers);
  std::vector<data::Gpt2Tokenizer> tokenizers(workers, tokenizer);
  std::vector<std::vector<int32_t>> piece_ids(pieces.size());
  std::atomic<size_t> next{0};
  std::unique_ptr<ProgressLine> progress;
  if (options.progress) progress = std::make_unique<ProgressLine>(total_bytes, stderr);
  ThreadPool pool(workers);
  // One loop index per worker, each with its own tokenizer, claiming pieces in order.
  pool.parallel_for(workers, [&](int64_t w) {
    for (size_t p = next++; p < pieces.size(); p = next++) {
      piece_ids[p] = tokenizers[size_t(w)].encode(pieces[p].text);
      if (progress) progress->add(pieces[p].text.size(), piece_ids[p].size());
    }
  });
  progress.reset();

  std::vector<std::vector<int32_t>> ids(documents.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    std::vector<int32_t>& doc = ids[pieces[p].document];
    doc.insert(doc.end(), piece_ids[p].begin(), piece_ids[p].end());
    std::vector<int32_t>().swap(piece_ids[p]);  // keep peak memory near one copy
  }
  return ids;
}

}  // namespace fsdp::tokenize
