// How the CPU-offloaded optimizer streams a rank's shard through host staging buffers.
//
// The gradients come down and the new compute weights go up in chunks of at most
// `capacity` elements, so the host needs a few chunk-sized staging buffers instead of a
// whole copy of the shard. A chunk is a list of pieces, each a slice of one optimizer range
// placed at an offset of the staging buffer: a range larger than the capacity spans several
// chunks; consecutive small ranges share one. Plain values, no device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdp {

struct OffloadPiece {
  size_t range = 0;         // index of the optimizer range
  int64_t begin = 0;        // first element within the range
  int64_t numel = 0;
  int64_t slot_offset = 0;  // where the piece sits in the chunk's staging buffer
};

struct OffloadChunk {
  std::vector<OffloadPiece> pieces;
  int64_t numel = 0;  // sum of the pieces, <= capacity
};

// Chunks covering every element of ranges of `range_numel` elements, in order (empty ranges
// contribute nothing). capacity must be positive.
std::vector<OffloadChunk> plan_offload_chunks(const std::vector<int64_t>& range_numel,
                                              int64_t capacity);

// For each of `ranges` ranges, the index of the last chunk holding a piece of it (the chunk
// after whose upload the range is complete), or -1 for a range with no elements.
std::vector<int64_t> last_chunk_of_ranges(const std::vector<OffloadChunk>& chunks, size_t ranges);

// The staging a shard of `total` elements needs: buffers of the largest chunk's size (every
// chunk but the last is full), as many as the pipeline's `slots` or the chunks, if fewer.
struct OffloadStaging {
  int64_t slot_numel = 0;
  int slots = 0;
};
OffloadStaging offload_staging(int64_t total, int64_t capacity, int slots);

}  // namespace fsdp
