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
  // `slots` buffers of `numel` elements of `dtype` on ctx's device, allocated now, from
  // the caching allocator or, `registrable`, as memory NCCL can register
  // (collectives/comm_memory.h).
  BufferPool(Context& ctx, std::string name, int slots, int64_t numel, DType dtype,
             bool registrable = false);

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
  size_t bytes() const { return slot_bytes(numel_, dtype_, registrable_) * buffers_.size(); }
  static size_t slot_bytes(int64_t numel, DType dtype, bool registrable);
  // Slot s's whole buffer, e.g. to register it with a communicator.
  const Tensor& slot_buffer(int s) const { return buffers_.at(size_t(s)); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int64_t numel_;
  DType dtype_;
  bool registrable_;
  std::vector<Tensor> buffers_;
  std::vector<Event> free_events_;
  std::vector<bool> held_;
  int next_ = 0;  // round-robin: the least recently released slot is reused first
};

}  // namespace fsdp
