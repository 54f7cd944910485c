#include "runtime/optim/offload_plan.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace fsdp {

std::vector<OffloadChunk> plan_offload_chunks(const std::vector<int64_t>& range_numel,
                                              int64_t capacity) {
  FSDP_CHECK(capacity > 0, ValueError, "offload chunks: the capacity must be positive, got ",
             capacity);
  std::vector<OffloadChunk> chunks;
  for (size_t r = 0; r < range_numel.size(); ++r) {
    FSDP_CHECK(range_numel[r] >= 0, ValueError, "offload chunks: range ", r, " has ",
               range_numel[r], " elements");
    for (int64_t begin = 0; begin < range_numel[r];) {
      if (chunks.empty() || chunks.back().numel == capacity) chunks.emplace_back();
      OffloadChunk& c = chunks.back();
      const int64_t n = std::min(range_numel[r] - begin, capacity - c.numel);
      c.pieces.push_back({r, begin, n, c.numel});
      c.numel += n;
      begin += n;
    }
  }
  return chunks;
}

std::vector<int64_t> last_chunk_of_ranges(const std::vector<OffloadChunk>& chunks, size_t ranges) {
  std::vector<int64_t> last(ranges, -1);
  for (size_t c = 0; c < chunks.size(); ++c)
    for (const OffloadPiece& p : chunks[c].pieces) {
      FSDP_CHECK(p.range < ranges, ValueError, "offload plan: piece of range ", p.range,
                 " among ", ranges, " ranges");
      last[p.range] = int64_t(c);
    }
  return last;
}

OffloadStaging offload_staging(int64_t total, int64_t capacity, int slots) {
  FSDP_CHECK(capacity > 0 && slots > 0, ValueError, "offload staging: ", slots,
             " slots of ", capacity, " elements (both must be positive)");
  if (total <= 0) return {};
  const int64_t chunks = (total + capacity - 1) / capacity;
  return {std::min(total, capacity), int(std::min<int64_t>(slots, chunks))};
}

}  // namespace fsdp
