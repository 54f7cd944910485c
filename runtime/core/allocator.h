// Allocators: where tensor memory comes from, and how much of it is in use.
//
// - HostAllocator: 64-byte aligned host memory. Freed blocks are cached by size class and
//   reused (a training step allocates the same sizes every iteration; returning 100 MB of
//   logits to the system each micro-batch would cost a page fault per 4 KiB).
// - PinnedHostAllocator: page-locked host memory (cudaHostAlloc) for fast async copies.
// - CudaCachingAllocator: device memory, stream-aware. Freed blocks are cached and reused
//   by later allocations of the same size class on the same stream, so a training step
//   that allocates the same sizes every iteration stops calling cudaMalloc after the first.
//   A block also used on another stream (record_stream) is reused only after events
//   recorded on those streams at free time have completed.
//
// Every allocator reports bytes in use, the peak in use, and bytes reserved from the system.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace fsdp {

struct MemoryStats {
  size_t in_use = 0;         // bytes handed out and not yet freed (after size rounding)
  size_t peak_in_use = 0;    // high-water mark of in_use since construction or reset_peak()
  size_t reserved = 0;       // bytes obtained from the system (in use + cached)
  size_t peak_reserved = 0;  // high-water mark of reserved
  size_t num_allocs = 0;     // allocate() calls served
  size_t num_system_allocs = 0;  // of those, how many needed new memory from the system
};

// The size class both caching allocators round a request of `bytes` up to (freed blocks are
// reused by requests of the same class): a multiple of 512 bytes and of 1/16 of the next
// power of two, at most 2 MiB. So rounding wastes at most 1/8 of a small request and at most
// 2 MiB of a large one (the flat buffers of big models), and memory predictions can apply
// the same function to know exactly what an allocation costs.
size_t allocation_size_class(size_t bytes);

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // Memory for `bytes` (> 0) that work on `stream` may use right away.
  virtual void* allocate(size_t bytes, const Stream& stream) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Declares that work queued on `stream` uses `ptr`; the block is not reused before that
  // work completes. No-op for host memory.
  virtual void record_stream(void* ptr, const Stream& stream) {}
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached but unused memory to the system.
  virtual void release_cached() {}
};

class HostAllocator : public Allocator {
 public:
  ~HostAllocator() override;
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "host"; }
  void* allocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void release_cached() override;

 protected:
  virtual void* system_alloc(size_t bytes);
  virtual void system_free(void* ptr);

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::unordered_map<void*, size_t> sizes_;           // live blocks: size class
  std::map<size_t, std::vector<void*>> free_;         // cached blocks by size class
};

// Page-locked host memory; falls back to nothing: without CUDA it throws DeviceError.
class PinnedHostAllocator : public HostAllocator {
 public:
  ~PinnedHostAllocator() override { release_cached(); }
  std::string name() const override { return "pinned-host"; }

 protected:
  void* system_alloc(size_t bytes) override;
  void system_free(void* ptr) override;
};

class CudaCachingAllocator : public Allocator {
 public:
  explicit CudaCachingAllocator(int device);
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  Device device() const override { return Device::cuda(device_); }
  std::string name() const override { return "cuda-caching"; }
  void* allocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, const Stream& stream) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void release_cached() override;


 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    CUstream_st* stream = nullptr;            // the stream it was allocated for
    std::vector<Stream> other_streams;        // streams that also used it
    std::vector<Event> pending;               // events to wait for before reuse
  };
  void* system_alloc_locked(size_t size);
  void collect_pending_locked();
  void release_cached_locked();

  int device_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::unordered_map<void*, Block> live_;
  // Free blocks by (stream, size class).
  std::map<std::pair<CUstream_st*, size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> cached_;   // free blocks, by pointer
  std::vector<Block> pending_free_;           // freed, waiting on other streams' events
};

}  // namespace fsdp
