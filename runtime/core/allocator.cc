#include "runtime/core/allocator.h"

#include <algorithm>
#include <cstdlib>

#include "runtime/core/error.h"

#if FSDP_WITH_CUDA
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {
namespace {

std::string mib(size_t bytes) { return str_cat(bytes / (1024.0 * 1024.0), " MiB"); }

void note_alloc(MemoryStats& s, size_t bytes) {
  s.in_use += bytes;
  s.peak_in_use = std::max(s.peak_in_use, s.in_use);
  s.num_allocs++;
}

}  // namespace

// ---------------------------------------------------------------- host

void* HostAllocator::system_alloc(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  FSDP_CHECK(p != nullptr, OutOfMemoryError, "host allocation of ", mib(bytes), " failed");
  return p;
}

void HostAllocator::system_free(void* ptr) { std::free(ptr); }

// Only cached blocks are returned here; live ones belong to tensors, which must not outlive
// their allocator. In a destructor virtual calls resolve to this class, so a derived
// allocator with its own system_free releases its cache in its own destructor first.
HostAllocator::~HostAllocator() { release_cached(); }

void* HostAllocator::allocate(size_t bytes, const Stream&) {
  FSDP_CHECK(bytes > 0, ValueError, name(), " allocator: zero-byte allocation");
  const size_t size = allocation_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    p = system_alloc(size);
    stats_.num_system_allocs++;
    stats_.reserved += size;
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  }
  sizes_[p] = size;
  note_alloc(stats_, size);
  return p;
}

void HostAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(ptr);
  FSDP_ASSERT(it != sizes_.end(), "freeing a pointer this allocator did not hand out");
  stats_.in_use -= it->second;
  free_[it->second].push_back(ptr);
  sizes_.erase(it);
}

void HostAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      system_free(p);
      stats_.reserved -= size;
    }
  }
  free_.clear();
}

MemoryStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void HostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_reserved = stats_.reserved;
}

#if FSDP_WITH_CUDA
void* PinnedHostAllocator::system_alloc(size_t bytes) {
  void* p = nullptr;
  FSDP_CALL(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void PinnedHostAllocator::system_free(void* ptr) { cudaFreeHost(ptr); }
#else
void* PinnedHostAllocator::system_alloc(size_t) {
  FSDP_THROW(DeviceError, "pinned host memory needs CUDA; this build has none (--config=cpu)");
}
void PinnedHostAllocator::system_free(void*) {}
#endif

// ---------------------------------------------------------------- CUDA caching

size_t allocation_size_class(size_t bytes) {
  size_t pow2 = 1;
  while (pow2 < bytes) pow2 <<= 1;
  const size_t granule = std::clamp<size_t>(pow2 / 16, 512, size_t(2) << 20);
  return (bytes + granule - 1) / granule * granule;
}

CudaCachingAllocator::CudaCachingAllocator(int device) : device_(device) {
  FSDP_CHECK(cuda_built(), DeviceError,
             "CUDA allocator requested, but this build has no CUDA support (--config=cpu)");
  const int n = cuda_device_count();
  FSDP_CHECK(device >= 0 && device < n, DeviceError, "CUDA device ", device,
             " requested, but this process sees ", n, " device(s) (check CUDA_VISIBLE_DEVICES)");
}

CudaCachingAllocator::~CudaCachingAllocator() {
  // Tensors must not outlive their allocator; whatever is cached goes back now.
  std::lock_guard<std::mutex> lock(mu_);
  try {
    release_cached_locked();
    for (auto& [id, pool] : pools_) {
      for (auto& [key, blocks] : pool.free)
        for (const Block& b : blocks) system_free_locked(b);
      for (const Block& b : pool.held) system_free_locked(b);
    }
    pools_.clear();
  } catch (...) {
    // Destructors cannot report; the process is tearing this device down anyway.
  }
}

#if FSDP_WITH_CUDA

void* CudaCachingAllocator::system_alloc_locked(size_t size) {
  DeviceGuard guard(Device::cuda(device_));
  void* p = nullptr;
  cudaError_t st = cudaMalloc(&p, size);
  if (st == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    // Give every cached block back and try once more.
    release_cached_locked();
    st = cudaMalloc(&p, size);
    if (st == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      FSDP_THROW(OutOfMemoryError, "CUDA out of memory on cuda:", device_, ": tried to allocate ",
                 mib(size), "; ", mib(stats_.in_use), " in use by this allocator, ",
                 mib(stats_.reserved), " reserved, ", mib(free_b), " free of ", mib(total_b));
    }
  }
  FSDP_CALL(st);
  stats_.num_system_allocs++;
  stats_.reserved += size;
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  return p;
}

void CudaCachingAllocator::collect_pending_locked() {
  for (size_t i = 0; i < pending_free_.size();) {
    Block& b = pending_free_[i];
    bool done = true;
    for (const Event& e : b.pending) done = done && e.query();
    if (!done) {
      ++i;
      continue;
    }
    b.pending.clear();
    b.other_streams.clear();
    free_[{b.stream, b.size}].push_back(b.ptr);
    cached_[b.ptr] = b;
    pending_free_[i] = pending_free_.back();
    pending_free_.pop_back();
  }
}

void* CudaCachingAllocator::allocate(size_t bytes, const Stream& stream) {
  FSDP_CHECK(bytes > 0, ValueError, "CUDA allocator: zero-byte allocation");
  FSDP_CHECK(stream.device() == device(), DeviceError, "allocation on ", device().str(),
             " for a stream of ", stream.device().str());
  const size_t size = allocation_size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (active_pool_ != 0 && std::this_thread::get_id() == pool_thread_)
    return pool_allocate_locked(size, stream);
  if (!pending_free_.empty()) collect_pending_locked();
  Block b = cached_or_new_locked(stream.cuda_stream(), size);
  live_[b.ptr] = b;
  note_alloc(stats_, size);
  if (tracing_ && std::this_thread::get_id() == trace_thread_) {
    const auto key = std::make_pair(b.stream, b.size);
    traced_.insert(b.ptr);
    trace_peak_[key] = std::max(trace_peak_[key], ++trace_live_[key]);
  }
  return b.ptr;
}

void CudaCachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  FSDP_ASSERT(it != live_.end(), "freeing a pointer this allocator did not hand out");
  Block b = std::move(it->second);
  live_.erase(it);
  stats_.in_use -= b.size;
  // A traced block used on other streams stays counted: a pool would hold it (see .h).
  if (tracing_ && traced_.erase(b.ptr) > 0 && b.other_streams.empty())
    trace_live_[{b.stream, b.size}]--;
  if (b.pool != 0) {
    pool_free_locked(std::move(b));
    return;
  }
  if (b.other_streams.empty()) {
    free_[{b.stream, b.size}].push_back(b.ptr);
    cached_[b.ptr] = b;
    return;
  }
  // Used on other streams too: reuse only after their queued work is done.
  for (const Stream& s : b.other_streams) {
    Event e = Event::create(device(), false);
    e.record(s);
    b.pending.push_back(e);
  }
  pending_free_.push_back(std::move(b));
}

void CudaCachingAllocator::record_stream(void* ptr, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  FSDP_CHECK(it != live_.end(), ValueError, "record_stream on a pointer this allocator does not own");
  if (stream.cuda_stream() == it->second.stream) return;
  for (const Stream& s : it->second.other_streams)
    if (s == stream) return;
  it->second.other_streams.push_back(stream);
}

void CudaCachingAllocator::release_cached_locked() {
  DeviceGuard guard(Device::cuda(device_));
  // Pending blocks may still be in use on other streams: wait for them first.
  for (Block& b : pending_free_)
    for (Event& e : b.pending) e.synchronize();
  collect_pending_locked();
  for (auto& [ptr, b] : cached_) {
    FSDP_CALL(cudaFree(ptr));
    stats_.reserved -= b.size;
  }
  cached_.clear();
  free_.clear();
}

void CudaCachingAllocator::system_free_locked(const Block& b) {
  DeviceGuard guard(Device::cuda(device_));
  FSDP_CALL(cudaFree(b.ptr));
  stats_.reserved -= b.size;
}

#else  // CPU-only build: the constructor already refused.

void* CudaCachingAllocator::system_alloc_locked(size_t) { return nullptr; }
void CudaCachingAllocator::system_free_locked(const Block&) {}
void CudaCachingAllocator::collect_pending_locked() {}
void* CudaCachingAllocator::allocate(size_t, const Stream&) { return nullptr; }
void CudaCachingAllocator::deallocate(void*) {}
void CudaCachingAllocator::record_stream(void*, const Stream&) {}
void CudaCachingAllocator::release_cached_locked() {}

#endif

MemoryStats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CudaCachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use = stats_.in_use;
  stats_.peak_reserved = stats_.reserved;
}

void CudaCachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

// ---------------------------------------------------------------- private pools

void* CudaCachingAllocator::pool_allocate_locked(size_t size, const Stream& stream) {
  PrivatePool& pool = pools_.at(active_pool_);
  auto it = pool.free.find({stream.cuda_stream(), size});
  FSDP_CHECK(it != pool.free.end() && !it->second.empty(), InternalError,
             "CUDA graph capture: the graph's private memory pool has no free block of ",
             mib(size), " for this stream: the captured work allocates more than the traced "
             "eager run of the same work did (is it not the same work every time?)");
  Block b = std::move(it->second.back());
  it->second.pop_back();
  pool.live++;
  live_[b.ptr] = b;
  note_alloc(stats_, size);
  return b.ptr;
}

void CudaCachingAllocator::pool_free_locked(Block b) {
  const int id = b.pool;
  PrivatePool& pool = pools_.at(id);
  pool.live--;
  if (pool.destroyed) {
    system_free_locked(b);
    if (pool.live == 0) pools_.erase(id);
    return;
  }
  if (!b.other_streams.empty()) {
    // Other streams may still use it: reusable only from end_pool_use() on.
    pool.held.push_back(std::move(b));
    return;
  }
  pool.free[{b.stream, b.size}].push_back(std::move(b));
}

void CudaCachingAllocator::begin_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK(!tracing_, InternalError, "allocator: begin_trace() while a trace is in progress");
  tracing_ = true;
  trace_thread_ = std::this_thread::get_id();
  trace_live_.clear();
  trace_peak_.clear();
  traced_.clear();
}

std::vector<CudaCachingAllocator::PoolDemand> CudaCachingAllocator::end_trace() {
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK(tracing_, InternalError, "allocator: end_trace() without begin_trace()");
  std::vector<PoolDemand> demand;
  for (const auto& [key, peak] : trace_peak_)
    if (peak > 0) demand.push_back(PoolDemand{key.first, key.second, peak});
  tracing_ = false;
  trace_live_.clear();
  trace_peak_.clear();
  traced_.clear();
  return demand;
}

// (Both builds: system_alloc_locked is defined in each.)
CudaCachingAllocator::Block CudaCachingAllocator::cached_or_new_locked(CUstream_st* stream,
                                                                       size_t size) {
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    Block b = std::move(cached_.at(p));
    cached_.erase(p);
    return b;
  }
  Block b;
  b.ptr = system_alloc_locked(size);
  b.size = size;
  b.stream = stream;
  return b;
}

int CudaCachingAllocator::create_pool(const std::vector<PoolDemand>& demand) {
  std::lock_guard<std::mutex> lock(mu_);
  FSDP_CHECK(active_pool_ == 0, InternalError, "allocator: create_pool() while a pool is in use");
  const int id = next_pool_++;
  PrivatePool& pool = pools_[id];
  try {
    for (const PoolDemand& d : demand) {
      for (int64_t i = 0; i < d.blocks; ++i) {
        // The shared cache's free blocks of this stream and size first: after a traced eager
        // run they are the very blocks that run used, so the pool costs no new memory.
        Block b = cached_or_new_locked(d.stream, d.size);
        b.pool = id;
        pool.free[{d.stream, d.size}].push_back(std::move(b));
      }
    }
  } catch (...) {
    for (auto& [key, blocks] : pool.free)
      for (const Block& b : blocks) system_free_locked(b);
    pools_.erase(id);
    throw;
  }
  return id;
}

void CudaCachingAllocator::begin_pool_use(int pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  FSDP_CHECK(it != pools_.end() && !it->second.destroyed, InternalError, "allocator: pool ", pool,
             " does not exist");
  FSDP_CHECK(active_pool_ == 0, InternalError, "allocator: pool ", active_pool_,
             " is already in use");
  active_pool_ = pool;
  pool_thread_ = std::this_thread::get_id();
}

void CudaCachingAllocator::end_pool_use() {
  std::lock_guard<std::mutex> lock(mu_);
  if (active_pool_ == 0) return;
  PrivatePool& pool = pools_.at(active_pool_);
  for (Block& b : pool.held) {
    b.other_streams.clear();
    pool.free[{b.stream, b.size}].push_back(std::move(b));
  }
  pool.held.clear();
  active_pool_ = 0;
}

int64_t CudaCachingAllocator::pool_live_blocks(int pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? 0 : it->second.live;
}

void CudaCachingAllocator::destroy_pool(int pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) return;
  if (active_pool_ == pool) active_pool_ = 0;
  PrivatePool& p = it->second;
  for (auto& [key, blocks] : p.free)
    for (const Block& b : blocks) system_free_locked(b);
  for (const Block& b : p.held) system_free_locked(b);
  p.free.clear();
  p.held.clear();
  p.destroyed = true;
  if (p.live == 0) pools_.erase(it);
}

}  // namespace fsdp
