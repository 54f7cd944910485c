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
//   Private pools serve CUDA graph capture (runtime/train/cuda_graph.h): memory a captured
//   graph uses must keep its addresses for as long as the graph may be replayed, so it comes
//   from blocks reserved for that graph before capture (never cudaMalloc while capturing),
//   and every such block, whenever it is freed, goes back to its pool only.
//
// Every allocator reports bytes in use, the peak in use, and bytes reserved from the system.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
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

  // ---- private pools (CUDA graphs)
  // How many blocks of one size class, for one stream, a region of work held at once.
  struct PoolDemand {
    CUstream_st* stream = nullptr;
    size_t size = 0;  // a size class
    int64_t blocks = 0;
  };
  // Counts, until end_trace(), the blocks that allocations made by the calling thread hold
  // at once, per (stream, size class): what a private pool needs to serve the same work
  // again. A block freed while other streams still used it stays counted (a pool does not
  // reuse such a block before end_pool_use()). One trace at a time.
  void begin_trace();
  std::vector<PoolDemand> end_trace();
  // A new private pool holding `demand`: cached free blocks first, cudaMalloc for the rest
  // (call it outside capture). Returns its id (> 0).
  int create_pool(const std::vector<PoolDemand>& demand);
  // Until end_pool_use(), every allocation by the calling thread is served from `pool`'s
  // free blocks of the same stream and size class, never from the system or the shared
  // cache; none left is an InternalError (the work differs from what was traced). Blocks
  // freed meanwhile are reused for later allocations of the same stream (stream order makes
  // that safe), except those also used on other streams, which wait for end_pool_use().
  void begin_pool_use(int pool);
  void end_pool_use();
  // The pool's blocks handed out and not freed (what escaped the work that used the pool).
  int64_t pool_live_blocks(int pool) const;
  // The pool's owner is gone: its free blocks return to the system now, its live ones when
  // they are freed.
  void destroy_pool(int pool);

 private:
  struct Block {
    void* ptr = nullptr;
    size_t size = 0;
    CUstream_st* stream = nullptr;            // the stream it was allocated for
    std::vector<Stream> other_streams;        // streams that also used it
    std::vector<Event> pending;               // events to wait for before reuse
    int pool = 0;                             // the private pool it belongs to (0: none)
  };
  struct PrivatePool {
    std::map<std::pair<CUstream_st*, size_t>, std::vector<Block>> free;
    std::vector<Block> held;  // freed during use while other streams used them
    int64_t live = 0;         // blocks handed out
    bool destroyed = false;
  };
  void* system_alloc_locked(size_t size);
  // A cached free block of this stream and size class, or a new one from the system.
  Block cached_or_new_locked(CUstream_st* stream, size_t size);
  void collect_pending_locked();
  void release_cached_locked();
  void* pool_allocate_locked(size_t size, const Stream& stream);
  void pool_free_locked(Block b);
  void system_free_locked(const Block& b);

  int device_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::unordered_map<void*, Block> live_;
  // Free blocks by (stream, size class).
  std::map<std::pair<CUstream_st*, size_t>, std::vector<void*>> free_;
  std::unordered_map<void*, Block> cached_;   // free blocks, by pointer
  std::vector<Block> pending_free_;           // freed, waiting on other streams' events
  // Private pools by id, the one in use (0: none) and the thread using it.
  std::map<int, PrivatePool> pools_;
  int next_pool_ = 1;
  int active_pool_ = 0;
  std::thread::id pool_thread_;
  // The trace in progress (begin_trace): its thread, live and peak counts per (stream, size).
  bool tracing_ = false;
  std::thread::id trace_thread_;
  std::map<std::pair<CUstream_st*, size_t>, int64_t> trace_live_, trace_peak_;
  std::unordered_set<void*> traced_;  // live blocks allocated during the trace
};

}  // namespace fsdp
