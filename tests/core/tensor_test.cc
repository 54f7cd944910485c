#include <numeric>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

Tensor arange(Context& ctx, const Shape& shape) {
  Tensor t = ctx.empty_host(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = float(i);
  return t;
}

}  // namespace

TEST_CASE("shapes: numel, strides, negative dims", "[core][shape]") {
  Shape s{2, 3, 4};
  CHECK(s.numel() == 24);
  CHECK(s.contiguous_strides() == std::vector<int64_t>{12, 4, 1});
  CHECK(s.at(-1) == 4);
  CHECK(s.str() == "(2, 3, 4)");
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_AS(s.at(3), IndexError);
  CHECK_THROWS_WITH(s.wrap_dim(-4), Catch::Contains("out of range for shape (2, 3, 4)"));
}

TEST_CASE("views share storage and index correctly", "[core][tensor]") {
  Context ctx;
  Tensor t = arange(ctx, Shape{2, 3, 4});  // element (i, j, k) = 12i + 4j + k
  CHECK(t.is_contiguous());
  CHECK(t.nbytes() == 96);

  Tensor v = t.view(Shape{6, -1});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.shares_storage(t));

  Tensor s = t.slice(1, 1, 3);  // (2, 2, 4), rows j = 1, 2
  CHECK(s.shape() == Shape{2, 2, 4});
  CHECK_FALSE(s.is_contiguous());
  CHECK(s.to_vector<float>()[0] == 4.0f);
  CHECK(s.to_vector<float>()[8] == 16.0f);  // (1, 1, 0) -> 12 + 4

  Tensor step = t.slice(2, 0, 4, 2);  // k = 0, 2
  CHECK(step.to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22});

  Tensor sel = t.select(0, 1);  // (3, 4) starting at 12
  CHECK(sel.shape() == Shape{3, 4});
  CHECK(sel.is_contiguous());
  CHECK(sel.to_vector<float>()[0] == 12.0f);

  Tensor tr = t.transpose(0, 2);  // (4, 3, 2)
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.to_vector<float>()[1] == 12.0f);  // (0, 0, 1) -> t(1, 0, 0)

  Tensor p = t.permute({1, 2, 0});  // (3, 4, 2)
  CHECK(p.to_vector<float>()[1] == 12.0f);
  CHECK(p.to_vector<float>()[2] == 1.0f);

  Tensor u = t.unsqueeze(0);
  CHECK(u.shape() == Shape{1, 2, 3, 4});
  CHECK(u.squeeze(0).shape() == t.shape());
  CHECK(t.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});

  // Writes through a view land in the base tensor.
  sel.data<float>()[0] = -1.0f;
  CHECK(t.to_vector<float>()[12] == -1.0f);
}

TEST_CASE("misuse raises clear errors", "[core][tensor]") {
  Context ctx;
  Tensor t = arange(ctx, Shape{2, 3});
  CHECK_THROWS_AS(t.view(Shape{4, 2}), ShapeError);
  CHECK_THROWS_WITH(t.view(Shape{4, 2}), Catch::Contains("8 elements requested"));
  CHECK_THROWS_AS(t.transpose(0, 1).view(Shape{6}), ShapeError);
  CHECK_THROWS_AS(t.slice(1, 0, 4), IndexError);
  CHECK_THROWS_WITH(t.slice(1, 2, 5), Catch::Contains("out of range"));
  CHECK_THROWS_AS(t.select(0, 2), IndexError);
  CHECK_THROWS_AS(t.data<double>(), DTypeError);
  CHECK_THROWS_AS(t.view(Shape{-1, -1}), ShapeError);
  CHECK_THROWS_AS(t.permute({0, 0}), ShapeError);
  CHECK_THROWS_AS(t.squeeze(0), ShapeError);
  Tensor undefined;
  CHECK_THROWS_AS(undefined.data_ptr(), ValueError);
  // A view reaching past its storage is refused.
  CHECK_THROWS_AS(t.as_strided(Shape{3, 3}, Strides{3, 1}, 0), IndexError);
  CHECK_THROWS_AS(Tensor::empty(Shape{-1}, DType::f32, ctx.host_allocator()), ShapeError);
}

TEST_CASE("copy_bytes and reinterpret", "[core][tensor]") {
  Context ctx;
  Tensor a = arange(ctx, Shape{4});
  Tensor b = ctx.empty_host(Shape{2, 2}, DType::f32);
  copy_bytes(b, a, ctx.stream());
  CHECK(b.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
  CHECK_THROWS_AS(copy_bytes(b, a.slice(0, 0, 3), ctx.stream()), ShapeError);
  Tensor h = ctx.empty_host(Shape{2}, DType::bf16);
  h.data<bf16>()[0] = bf16(1.0f);
  CHECK(h.reinterpret(DType::u16).data<uint16_t>()[0] == 0x3f80);
  CHECK_THROWS_AS(h.reinterpret(DType::f32), DTypeError);
  CHECK(a.slice(0, 1, 2).item() == 1.0);
  CHECK_THROWS_AS(b.item(), ShapeError);
}

TEST_CASE("host allocator accounting and caching", "[core][allocator]") {
  HostAllocator alloc;
  // Sizes are rounded to their size class (multiples of 512 bytes here).
  void* p = alloc.allocate(1000, Stream());
  void* q = alloc.allocate(24, Stream());
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  MemoryStats s = alloc.stats();
  CHECK(s.in_use == 1024 + 512);
  CHECK(s.peak_in_use == 1536);
  CHECK(s.reserved == 1536);
  CHECK(s.num_allocs == 2);
  CHECK(s.num_system_allocs == 2);
  alloc.deallocate(p);
  CHECK(alloc.stats().in_use == 512);
  CHECK(alloc.stats().reserved == 1536);  // cached, not returned
  CHECK(alloc.stats().peak_in_use == 1536);
  // The same size class comes back from the cache without a system allocation.
  void* r = alloc.allocate(1020, Stream());
  CHECK(r == p);
  CHECK(alloc.stats().num_system_allocs == 2);
  alloc.reset_peak();
  CHECK(alloc.stats().peak_in_use == 1536);
  alloc.deallocate(r);
  alloc.deallocate(q);
  CHECK(alloc.stats().in_use == 0);
  alloc.release_cached();
  CHECK(alloc.stats().reserved == 0);
  CHECK_THROWS_AS(alloc.allocate(0, Stream()), ValueError);
}

TEST_CASE("tensors return memory to their allocator", "[core][allocator]") {
  auto alloc = std::make_shared<HostAllocator>();
  {
    Tensor t = Tensor::empty(Shape{256}, DType::f32, alloc);
    Tensor v = t.slice(0, 10, 20);
    CHECK(alloc->stats().in_use == 1024);
    t = Tensor();
    CHECK(alloc->stats().in_use == 1024);  // the view keeps the storage alive
  }
  CHECK(alloc->stats().in_use == 0);
}

TEST_CASE("allocation size classes waste at most 1/8, and at most 2 MiB", "[core][allocator]") {
  for (size_t n : {1ul, 511ul, 513ul, 4096ul, 1000000ul, 123456789ul, 5000000000ul}) {
    const size_t r = allocation_size_class(n);
    CHECK(r >= n);
    CHECK(r % 512 == 0);
    CHECK(double(r - n) <= std::max(512.0, double(n) / 8));
    CHECK(r - n < (size_t(2) << 20));
  }
  CHECK(allocation_size_class(1 << 20) == (1 << 20));
}

TEST_CASE("CPU-only stream and event semantics", "[core][stream]") {
  Stream s;
  CHECK_FALSE(s.is_cuda());
  CHECK(s.query());
  Event e;
  e.record(s);
  CHECK(e.recorded());
  CHECK(e.query());
  s.wait(e);
  CHECK_THROWS_AS(s.cuda_stream(), DeviceError);
}

TEST_CASE("context extensions are created once and per context", "[core][context]") {
  struct Counter {
    explicit Counter(Context&) {}
    int n = 0;
  };
  Context a, b;
  a.extension<Counter>().n = 3;
  CHECK(a.extension<Counter>().n == 3);
  CHECK(b.extension<Counter>().n == 0);
}

TEST_CASE("CUDA contexts: allocator caches and accounts per stream", "[core][gpu]") {
  FSDP_REQUIRE_GPU();
  Context ctx(Device::cuda(0));
  auto& alloc = *ctx.allocator();
  const MemoryStats before = alloc.stats();
  void* p = alloc.allocate(3 << 20, ctx.stream());
  CHECK(alloc.stats().in_use - before.in_use == allocation_size_class(3 << 20));
  alloc.deallocate(p);
  void* q = alloc.allocate(3 << 20, ctx.stream());
  CHECK(q == p);  // same size class, same stream: reused without cudaMalloc
  CHECK(alloc.stats().num_system_allocs == before.num_system_allocs + 1);
  // Used on another stream: not reused until that stream's work is done, then reused.
  Stream other = Stream::create_cuda(0);
  alloc.record_stream(q, other);
  alloc.deallocate(q);
  other.synchronize();
  void* r = alloc.allocate(3 << 20, ctx.stream());
  CHECK(r == q);
  alloc.deallocate(r);
  alloc.release_cached();
  CHECK(alloc.stats().reserved == before.reserved);
  // Host <-> device byte copies.
  Tensor h = ctx.empty_host(Shape{4}, DType::f32);
  for (int i = 0; i < 4; ++i) h.data<float>()[i] = float(i) + 0.5f;
  Tensor d = ctx.empty(Shape{4}, DType::f32);
  copy_bytes(d, h, ctx.stream());
  Tensor back = ctx.empty_host(Shape{4}, DType::f32);
  copy_bytes(back, d, ctx.stream());
  CHECK(back.to_vector<float>() == h.to_vector<float>());
  // Asynchronous copies: page-locked host memory both ways, ordered by an event; pageable
  // memory is refused (the copy would not be asynchronous).
  Tensor pinned = ctx.empty_pinned(Shape{4}, DType::f32), pinned_back = ctx.empty_pinned(Shape{4}, DType::f32);
  for (int i = 0; i < 4; ++i) pinned.data<float>()[i] = float(i) - 7.25f;
  copy_bytes_async(d, pinned, ctx.stream());
  copy_bytes_async(pinned_back, d, ctx.stream());
  Event done;
  done.record(ctx.stream());
  done.synchronize();
  CHECK(pinned_back.to_vector<float>() == pinned.to_vector<float>());
  CHECK_THROWS_AS(copy_bytes_async(d, h, ctx.stream()), DeviceError);
  CHECK_THROWS_AS(copy_bytes_async(back, d, ctx.stream()), DeviceError);
  CHECK_THROWS_AS(ctx.empty(Shape{int64_t(1) << 50}, DType::f32), OutOfMemoryError);
}
