#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "runtime/optim/offload_plan.h"
#include "runtime/optim/offload_step.h"
#include "runtime/optim/optimizer.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using fsdp::testing::random_tensor;

namespace {

// Every element of every range is covered exactly once, in order, within the capacity.
void check_covers(const std::vector<OffloadChunk>& chunks, const std::vector<int64_t>& numel,
                  int64_t capacity) {
  std::vector<int64_t> next(numel.size(), 0);
  size_t last_range = 0;
  for (const OffloadChunk& c : chunks) {
    int64_t in_slot = 0;
    CHECK(c.numel <= capacity);
    CHECK(c.numel > 0);
    for (const OffloadPiece& p : c.pieces) {
      CHECK(p.numel > 0);
      CHECK(p.slot_offset == in_slot);
      CHECK(p.range >= last_range);
      CHECK(p.begin == next[p.range]);
      next[p.range] += p.numel;
      in_slot += p.numel;
      last_range = p.range;
    }
    CHECK(in_slot == c.numel);
  }
  CHECK(next == numel);
}

template <typename T>
std::vector<T> host_values(const Tensor& t) {
  const T* p = static_cast<const T*>(t.data_ptr());
  return std::vector<T>(p, p + t.numel());
}

}  // namespace

TEST_CASE("offload chunks pack small ranges and split large ones", "[optim]") {
  const std::vector<int64_t> numel = {10, 0, 3, 25, 1, 1, 8};
  for (int64_t capacity : {1, 4, 10, 16, 100}) {
    INFO("capacity " << capacity);
    const auto chunks = plan_offload_chunks(numel, capacity);
    check_covers(chunks, numel, capacity);
    // Every chunk but the last is full: the staging slots are used to the brim.
    for (size_t c = 0; c + 1 < chunks.size(); ++c) CHECK(chunks[c].numel == capacity);
  }
  const auto chunks = plan_offload_chunks(numel, 16);
  REQUIRE(chunks.size() == 3);  // 48 elements
  CHECK(chunks[0].pieces.size() == 3);  // 10 of range 0, 3 of range 2, 3 of range 3
  CHECK(chunks[0].pieces[2].range == 3);
  CHECK(chunks[0].pieces[2].numel == 3);
  CHECK(plan_offload_chunks({}, 8).empty());
  // Staging: buffers of the largest chunk, no more of them than chunks.
  CHECK(offload_staging(48, 16, 3).slot_numel == 16);
  CHECK(offload_staging(48, 16, 3).slots == 3);
  CHECK(offload_staging(48, 16, 2).slots == 2);
  CHECK(offload_staging(20, 16, 3).slots == 2);
  CHECK(offload_staging(5, 16, 3).slot_numel == 5);
  CHECK(offload_staging(5, 16, 3).slots == 1);
  CHECK(offload_staging(0, 16, 3).slots == 0);
  CHECK_THROWS_AS(offload_staging(5, 16, 0), ValueError);
  CHECK(plan_offload_chunks({0, 0}, 8).empty());
  CHECK_THROWS_AS(plan_offload_chunks({4}, 0), ValueError);
  CHECK_THROWS_AS(plan_offload_chunks({-1}, 4), ValueError);
  // The chunk after which each range is complete (-1: an empty range).
  CHECK(last_chunk_of_ranges(plan_offload_chunks(numel, 16), numel.size()) ==
        std::vector<int64_t>{0, -1, 0, 2, 2, 2, 2});  // range 3 spans chunks 0-2
}

TEST_CASE("the streamed offload step equals the direct host update, bit for bit", "[optim]") {
  // On a CPU context the pipeline's copies are plain memory copies: what is tested here is
  // the chunking, the slot reuse and the per-range decay, against one update per range.
  Context ctx;
  const std::vector<int64_t> numel = {1000, 7, 0, 2500, 33};
  for (DType moments : {DType::f32, DType::bf16}) {
    INFO("moments " << dtype_name(moments));
    std::vector<OptimizerRange> ranges;
    std::vector<Tensor> m, v, m_ref, v_ref, main_ref, copy_ref;
    std::vector<double> decay;
    for (size_t i = 0; i < numel.size(); ++i) {
      OptimizerRange r;
      r.name = "range" + std::to_string(i);
      r.main = random_tensor(ctx, Shape{numel[i]}, DType::f32, uint32_t(1 + i));
      r.grad = random_tensor(ctx, Shape{numel[i]}, DType::bf16, uint32_t(100 + i), -1, 1);
      r.param_copy = ops::zeros(ctx, Shape{numel[i]}, DType::bf16);
      r.weight_decay = i % 2 == 0;
      decay.push_back(r.weight_decay ? 0.1 : 0.0);
      main_ref.push_back(ops::clone(ctx, r.main));
      copy_ref.push_back(ops::zeros(ctx, Shape{numel[i]}, DType::bf16));
      for (auto* list : {&m, &v, &m_ref, &v_ref}) list->push_back(ops::zeros(ctx, Shape{numel[i]}, moments));
      ranges.push_back(r);
    }
    OffloadOptions o;
    o.chunk_numel = 300;  // many chunks, several per range, some shared by ranges
    o.slots = 2;
    o.threads = 3;
    OffloadedAdamW offload(ctx, ranges, o);
    CHECK(offload.chunks() == size_t((1000 + 7 + 2500 + 33 + 299) / 300));
    CHECK(offload.staging_bytes() == size_t(2 * 300 * (2 + 2)));
    ops::AdamWParams a;
    a.lr = 1e-2;
    a.grad_scale = 0.7;
    for (int64_t s = 1; s <= 2; ++s) {
      a.step = s;
      offload.step(ranges, m, v, 0.1, a);
      for (size_t i = 0; i < ranges.size(); ++i) {
        ops::AdamWParams b = a;
        b.weight_decay = decay[i];
        ops::adamw_step_host_f32(ctx, main_ref[i], ranges[i].grad, m_ref[i], v_ref[i], b, copy_ref[i]);
      }
    }
    for (size_t i = 0; i < ranges.size(); ++i) {
      INFO(ranges[i].name);
      CHECK(host_values<float>(ranges[i].main) == host_values<float>(main_ref[i]));
      CHECK(host_values<uint16_t>(ranges[i].param_copy) == host_values<uint16_t>(copy_ref[i]));
    }
  }
}

TEST_CASE("the overlapped offload step equals the in-step one; ranges complete in order",
          "[optim]") {
  // CPU context: the background thread runs the same pipeline with plain copies. The
  // overlapped step reads a snapshot of the gradients, so changing them after step() returns
  // (the next backward) must not change the update.
  Context ctx;
  const std::vector<int64_t> numel = {1000, 7, 0, 2500, 33};
  const std::vector<size_t> order = {4, 0, 1, 2, 3};  // a root last in the list goes first
  auto make = [&](uint32_t seed) {
    std::vector<OptimizerRange> ranges;
    for (size_t i = 0; i < numel.size(); ++i) {
      OptimizerRange r;
      r.name = "range" + std::to_string(i);
      r.main = random_tensor(ctx, Shape{numel[i]}, DType::f32, uint32_t(1 + i));
      r.grad = random_tensor(ctx, Shape{numel[i]}, DType::bf16, uint32_t(seed + i), -1, 1);
      r.param_copy = ops::zeros(ctx, Shape{numel[i]}, DType::bf16);
      r.weight_decay = i % 2 == 0;
      ranges.push_back(r);
    }
    return ranges;
  };
  std::vector<OptimizerRange> in_step = make(100), overlapped = make(100);
  std::vector<Tensor> m1, v1, m2, v2;
  for (int64_t n : numel)
    for (auto* list : {&m1, &v1, &m2, &v2}) list->push_back(ops::zeros(ctx, Shape{n}, DType::f32));
  OffloadOptions o;
  o.chunk_numel = 300;
  o.slots = 2;
  o.threads = 2;
  OffloadedAdamW a(ctx, in_step, o);
  o.overlap = true;
  o.order = order;
  OffloadedAdamW b(ctx, overlapped, o);
  CHECK(b.snapshot_bytes() >= size_t(3540 * 2));
  Event ready;
  CHECK(b.range_ready(3, false, &ready));  // nothing in flight: ready at once
  ops::AdamWParams p;
  p.lr = 1e-2;
  for (int64_t s = 1; s <= 3; ++s) {
    p.step = s;
    a.step(in_step, m1, v1, 0.1, p);
    b.step(overlapped, m2, v2, 0.1, p);
    // The next backward overwrites the gradients while the update may still run: the
    // update must read its snapshot, not these.
    for (size_t i = 0; i < numel.size(); ++i) ops::fill(ctx, overlapped[i].grad, 100.0);
    for (size_t k : order) CHECK(b.range_ready(k, true, &ready));
    b.finish();
    for (size_t i = 0; i < numel.size(); ++i)  // the next step's gradients, as in_step's
      ops::copy(ctx, overlapped[i].grad, in_step[i].grad);
  }
  for (size_t i = 0; i < numel.size(); ++i) {
    INFO(in_step[i].name);
    CHECK(host_values<float>(overlapped[i].main) == host_values<float>(in_step[i].main));
    CHECK(host_values<uint16_t>(overlapped[i].param_copy) == host_values<uint16_t>(in_step[i].param_copy));
    CHECK(host_values<float>(m2[i]) == host_values<float>(m1[i]));
  }
  // An order that is not a permutation of the ranges is refused.
  o.order = {0, 0, 1, 2, 3};
  CHECK_THROWS_AS(OffloadedAdamW(ctx, in_step, o), ValueError);
  o.order = {0, 1};
  CHECK_THROWS_AS(OffloadedAdamW(ctx, in_step, o), ValueError);
}

TEST_CASE("offload refuses mixed gradient dtypes and master weights off the host", "[optim]") {
  Context ctx;
  OptimizerRange a, b;
  a.name = "a";
  a.main = ops::zeros(ctx, Shape{4}, DType::f32);
  a.grad = ops::zeros(ctx, Shape{4}, DType::bf16);
  b = a;
  b.name = "b";
  b.grad = ops::zeros(ctx, Shape{4}, DType::f32);
  CHECK_THROWS_AS(OffloadedAdamW(ctx, {a, b}, OffloadOptions{}), DTypeError);
  b.grad = a.grad;
  b.main = ops::zeros(ctx, Shape{4}, DType::bf16);
  CHECK_THROWS_AS(OffloadedAdamW(ctx, {a, b}, OffloadOptions{}), ValueError);
}

TEST_CASE("the optimizer offloaded to the host follows the CUDA optimizer", "[optim][gpu]") {
  FSDP_REQUIRE_GPU();
  Context gpu(Device::cuda(0)), cpu;
  const std::vector<int64_t> numel = {(1 << 20) + 5, 77, 3 << 20};
  std::vector<OptimizerRange> on_gpu, offloaded, overlapped;
  for (size_t i = 0; i < numel.size(); ++i) {
    Tensor init = random_tensor(cpu, Shape{numel[i]}, DType::f32, uint32_t(1 + i));
    OptimizerRange r;
    r.name = "range" + std::to_string(i);
    r.grad = ops::to_device(gpu, random_tensor(cpu, Shape{numel[i]}, DType::bf16, uint32_t(50 + i), -1, 1), gpu.device());
    r.param_copy = ops::zeros(gpu, Shape{numel[i]}, DType::bf16);
    r.weight_decay = i != 1;
    r.main = ops::to_device(gpu, init, gpu.device());
    on_gpu.push_back(r);
    r.param_copy = ops::zeros(gpu, Shape{numel[i]}, DType::bf16);
    r.main = gpu.empty_pinned(Shape{numel[i]}, DType::f32);
    ops::copy(cpu, r.main, init);
    offloaded.push_back(r);
    r.param_copy = ops::zeros(gpu, Shape{numel[i]}, DType::bf16);
    r.main = gpu.empty_pinned(Shape{numel[i]}, DType::f32);
    ops::copy(cpu, r.main, init);
    overlapped.push_back(r);
  }
  OptimizerConfig c;
  c.weight_decay = 0.1;
  c.moments_dtype = DType::bf16;
  c.offload.chunk_numel = 1 << 20;  // several chunks, a range split across them
  c.offload.slots = 2;
  Optimizer reference(gpu, on_gpu, c), host(gpu, offloaded, c);
  REQUIRE(host.offloaded());
  CHECK(host.offload()->chunks() == 5);
  // The same update in the background, ranges in another order, waited for per range.
  c.offload.overlap = true;
  c.offload.order = {2, 0, 1};
  Optimizer background(gpu, overlapped, c);
  // Device work queued ahead of the overlapped step (a few ms of fills) delays its gradient
  // snapshot: a host update that did not wait for the snapshot would read stale gradients.
  const Tensor busy = ops::zeros(gpu, Shape{int64_t(1) << 26}, DType::f32);
  for (int s = 0; s < 3; ++s) {
    reference.step(1e-3, 0.5);
    host.step(1e-3, 0.5);
    for (int k = 0; k < 30; ++k) ops::fill(gpu, busy, double(k));
    background.step(1e-3, 0.5);
    for (size_t i : {2, 0, 1}) {
      Event ready;
      REQUIRE(background.range_ready(i, true, &ready));
      gpu.stream().wait(ready);
    }
  }
  background.finish_update();
  gpu.stream().synchronize();
  for (size_t i = 0; i < numel.size(); ++i) {
    INFO("overlapped " << overlapped[i].name);
    CHECK(host_values<float>(overlapped[i].main) == host_values<float>(offloaded[i].main));
    CHECK(host_values<uint16_t>(ops::to_device(gpu, overlapped[i].param_copy, Device::cpu())) ==
          host_values<uint16_t>(ops::to_device(gpu, offloaded[i].param_copy, Device::cpu())));
  }
  for (size_t i = 0; i < numel.size(); ++i) {
    INFO(on_gpu[i].name);
    const auto want = host_values<float>(ops::to_device(gpu, on_gpu[i].main, Device::cpu()));
    const auto got = host_values<float>(offloaded[i].main);
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) worst = std::max(worst, double(std::fabs(want[k] - got[k])));
    // Same f32 formula on both sides; only FMA contraction on the device differs (last bits).
    CHECK(worst < 1e-6);
    const auto cg = host_values<uint16_t>(ops::to_device(gpu, on_gpu[i].param_copy, Device::cpu()));
    const auto ch = host_values<uint16_t>(ops::to_device(gpu, offloaded[i].param_copy, Device::cpu()));
    size_t differ = 0;
    for (size_t k = 0; k < cg.size(); ++k) differ += cg[k] != ch[k];
    CHECK(differ <= cg.size() / 1000 + 1);
  }
}
