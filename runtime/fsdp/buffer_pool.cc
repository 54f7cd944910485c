#include "runtime/fsdp/buffer_pool.h"

#include "collectives/comm_memory.h"
#include "kernels/ops.h"
#include "runtime/core/error.h"

namespace fsdp {

BufferPool::BufferPool(Context& ctx, std::string name, int slots, int64_t numel, DType dtype,
                       bool registrable)
    : name_(std::move(name)), numel_(numel), dtype_(dtype), registrable_(registrable) {
  FSDP_CHECK(slots >= 1, ValueError, "buffer pool '", name_, "' needs at least one slot");
  for (int i = 0; i < slots; ++i) {
    // Zeroed once, so that no slot ever holds garbage (a benchmark that skips the gathers
    // still computes on finite numbers).
    Tensor slot;
    if (registrable) {
      slot = zeros_registrable(ctx, numel, dtype, str_cat(name_, " slot ", i));
    } else {
      slot = ctx.empty(Shape{std::max<int64_t>(numel, 1)}, dtype);
      ops::fill(ctx, slot, 0.0);
    }
    buffers_.push_back(slot);
    free_events_.emplace_back();
    held_.push_back(false);
  }
}

BufferPool::Lease BufferPool::acquire(const Stream& stream) {
  const int n = slots();
  for (int k = 0; k < n; ++k) {
    const int s = (next_ + k) % n;
    if (held_[size_t(s)]) continue;
    held_[size_t(s)] = true;
    next_ = (s + 1) % n;
    stream.wait(free_events_[size_t(s)]);
    return {s, buffers_[size_t(s)]};
  }
  FSDP_THROW(InternalError, "buffer pool '", name_, "': all ", n,
             " slots are held (the schedule holds more buffers than it planned)");
}

void BufferPool::release(int slot, const Stream& last_use) {
  FSDP_ASSERT(slot >= 0 && slot < slots() && held_[size_t(slot)], "releasing slot ", slot,
              " of pool '", name_, "' that is not held");
  held_[size_t(slot)] = false;
  // Re-recording is safe: a stream that waited earlier captured the event's state then.
  free_events_[size_t(slot)].record(last_use);
}

size_t BufferPool::slot_bytes(int64_t numel, DType dtype, bool registrable) {
  const size_t bytes = size_t(std::max<int64_t>(numel, 1)) * dtype_size(dtype);
  return registrable ? registrable_bytes(bytes) : allocation_size_class(bytes);
}

int BufferPool::in_use() const {
  int n = 0;
  for (bool h : held_) n += h;
  return n;
}

}  // namespace fsdp
