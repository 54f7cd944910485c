// ArenaLayout: where many buffers of one dtype sit inside one allocation. Carving a class of
// buffers (every unit's master weights, say) out of one allocation costs one allocator
// size-class rounding for the whole class instead of one per buffer, and gives every byte an
// owner a memory prediction can name.
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp {

struct ArenaLayout {
  // Buffer offsets are aligned to this many elements (256 bytes of bf16: vectorized loads).
  static constexpr int64_t kAlign = 128;
  std::vector<int64_t> offsets;  // per buffer, in add order; -1 for a skipped one
  int64_t numel = 0;             // elements the allocation needs

  // The next buffer, of n elements; returns its offset.
  int64_t add(int64_t n) {
    numel = (numel + kAlign - 1) / kAlign * kAlign;
    offsets.push_back(numel);
    numel += n;
    return offsets.back();
  }
  // The next buffer is absent (keeps offsets aligned with the caller's numbering).
  void skip() { offsets.push_back(-1); }
  bool empty() const { return numel == 0; }
};

}  // namespace fsdp
