// The CUDA caching allocator's private pools (CUDA graphs, runtime/train/cuda_graph.h): a
// trace counts what a piece of work holds at once; a pool reserved from it serves the same
// work again from its own blocks, never from the system; its blocks never go back to the
// shared cache; running out is an error, not a cudaMalloc.
#include <set>
#include <vector>

#include "runtime/core/allocator.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

using namespace fsdp;
using Catch::Matchers::Contains;

namespace {

// A fixed "micro-batch" of allocations and frees: at most two 1 MiB blocks and one 3 MiB
// block held at once.
std::vector<void*> work(CudaCachingAllocator& a, const Stream& s) {
  void* x = a.allocate(1 << 20, s);
  void* y = a.allocate(1 << 20, s);
  a.deallocate(x);
  void* z = a.allocate(3 << 20, s);
  void* w = a.allocate(1 << 20, s);  // reuses x's block
  a.deallocate(y);
  a.deallocate(z);
  return {x, y, z, w};  // w stays live: the work's "output"
}

}  // namespace

TEST_CASE("CUDA allocator: a traced demand reserves a private pool that serves the same work",
          "[core][gpu]") {
  FSDP_REQUIRE_GPU();
  Context ctx(Device::cuda(0));
  auto& a = dynamic_cast<CudaCachingAllocator&>(*ctx.allocator());
  const Stream& s = ctx.stream();

  a.begin_trace();
  std::vector<void*> eager = work(a, s);
  const std::vector<CudaCachingAllocator::PoolDemand> demand = a.end_trace();
  a.deallocate(eager[3]);
  REQUIRE(demand.size() == 2);
  for (const auto& d : demand) {
    CHECK(d.stream == s.cuda_stream());
    CHECK(d.blocks == (d.size == allocation_size_class(1 << 20) ? 2 : 1));
  }

  // The pool takes the cached blocks the traced run freed: no new memory.
  const MemoryStats before = a.stats();
  const int pool = a.create_pool(demand);
  CHECK(a.stats().num_system_allocs == before.num_system_allocs);
  a.begin_pool_use(pool);
  std::vector<void*> again = work(a, s);
  // Blocks freed in the pool are reused; more than was traced at once is an error naming
  // the pool, never a cudaMalloc.
  void* extra = a.allocate(1 << 20, s);
  CHECK_THROWS_AS(a.allocate(1 << 20, s), InternalError);
  CHECK_THROWS_WITH(a.allocate(1 << 20, s), Contains("private memory pool"));
  a.deallocate(extra);
  a.end_pool_use();
  CHECK(a.stats().num_system_allocs == before.num_system_allocs);
  CHECK(a.pool_live_blocks(pool) == 1);  // the work's output
  const std::set<void*> pool_blocks(again.begin(), again.end());

  // Outside the pool, allocations never get the pool's blocks, freed or not.
  a.deallocate(again[3]);
  CHECK(a.pool_live_blocks(pool) == 0);
  std::vector<void*> outside;
  for (int i = 0; i < 3; ++i) outside.push_back(a.allocate(1 << 20, s));
  outside.push_back(a.allocate(3 << 20, s));
  for (void* p : outside) CHECK(pool_blocks.count(p) == 0);
  for (void* p : outside) a.deallocate(p);

  // A live block of a destroyed pool goes back to the system when freed.
  a.begin_pool_use(pool);
  void* kept = a.allocate(1 << 20, s);
  a.end_pool_use();
  const size_t reserved = a.stats().reserved;
  a.destroy_pool(pool);
  CHECK(a.stats().reserved == reserved - allocation_size_class(1 << 20) - allocation_size_class(3 << 20));
  a.deallocate(kept);
  CHECK(a.stats().reserved == reserved - 2 * allocation_size_class(1 << 20) - allocation_size_class(3 << 20));
  CHECK_THROWS_AS(a.begin_pool_use(pool), InternalError);
}
