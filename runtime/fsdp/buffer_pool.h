// BufferPool: a fixed set of equal-size buffers (slots) for gathered unit weights or full
// unit gradients, reused round-robin.
//
// A slot is handed out on the host at once (the schedule never holds more slots than the
// pool has: that would be a bug, reported as InternalError), but its memory may still be in
// use on the device by the slot's previous holder. So every release records an event on the
// stream of the last reader, and acquire(stream) makes `stream` wait for that event before
// anything it queues can touch the slot. Lifetimes across streams are enforced by events.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/context.h"

namespace fsdp {

class BufferPool {
 public:
  // `slots` buffers of `numel` elements of `dtype` on ctx's device, allocated now.
  BufferPool(Context& ctx, std::string name, int slots, int64_t numel, DType dtype);

  struct Lease {
    int slot = -1;
    Tensor buffer;  // the whole slot; callers take views of the first elements they need
  };
  // A free slot, whose previous users' work `stream` will wait for.
  Lease acquire(const Stream& stream);
  // Returns `slot`; work queued on `last_use` up to now may still read or write it.
  void release(int slot, const Stream& last_use);

  int slots() const { return int(buffers_.size()); }
  int in_use() const;
  int64_t slot_numel() const { return numel_; }
  // What the slots cost (each one allocation of at least one element).
  size_t bytes() const {
    return allocation_size_class(size_t(std::max<int64_t>(numel_, 1)) * dtype_size(dtype_)) *
           buffers_.size();
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int64_t numel_;
  DType dtype_;
  std::vector<Tensor> buffers_;
  std::vector<Event> free_events_;
  std::vector<bool> held_;
  int next_ = 0;  // round-robin: the least recently released slot is reused first
};

}  // namespace fsdp
