// The CPU backend's arithmetic: rank order, accumulation types, prescale, avg, max/min.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/host_reduce.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

TEST_CASE("bf16 is summed in f32 in rank order and rounded once") {
  // bf16 steps by 2^-7 near 1. 1 + 2^-8 + 2^-8 summed in f32 is 1 + 2^-7, exact in bf16;
  // rounding after every addition (summing in bf16) would give 1 (ties to even) twice.
  const float tiny = 1.0f / 256.0f;
  std::vector<bf16> blocks = {bf16(1.0f), bf16(tiny), bf16(tiny)};
  bf16 out;
  reduce_in_rank_order(blocks.data(), 3, 1, DType::bf16, ReduceOp::Sum, 1.0, &out);
  CHECK(float(out) == 1.0f + 2 * tiny);

  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const int nranks = 4;
  const size_t count = 1000;
  std::vector<bf16> in(nranks * count);
  for (auto& v : in) v = bf16(dist(gen));
  std::vector<bf16> got(count);
  reduce_in_rank_order(in.data(), nranks, count, DType::bf16, ReduceOp::Avg, 0.5, got.data());
  for (size_t i = 0; i < count; ++i) {
    float acc = float(in[i]) * 0.5f;
    for (int r = 1; r < nranks; ++r) acc += float(in[size_t(r) * count + i]) * 0.5f;
    REQUIRE(got[i].bits == bf16(acc / 4.0f).bits);
  }
}

TEST_CASE("f32 is summed in f32 in rank order (not in double, not reordered)") {
  // (1e8 + 1) - 1e8 is 0 in f32 left to right, 1 in double, 1e8-ish reordered.
  std::vector<float> blocks = {1e8f, 1.0f, -1e8f};
  float out = -7;
  reduce_in_rank_order(blocks.data(), 3, 1, DType::f32, ReduceOp::Sum, 1.0, &out);
  CHECK(out == 0.0f);
  std::vector<double> wide = {1e8, 1.0, -1e8};
  double dout = -7;
  reduce_in_rank_order(wide.data(), 3, 1, DType::f64, ReduceOp::Sum, 1.0, &dout);
  CHECK(dout == 1.0);
}

TEST_CASE("integers: sums wrap, avg truncates, prescale multiplies, max/min") {
  std::vector<int32_t> blocks = {INT32_MAX, 1, -7, 2};  // 2 ranks x 2 elements
  std::vector<int32_t> out(2);
  reduce_in_rank_order(blocks.data(), 2, 2, DType::i32, ReduceOp::Sum, 1.0, out.data());
  CHECK(out[0] == INT32_MAX - 7);
  CHECK(out[1] == 3);
  reduce_in_rank_order(blocks.data(), 2, 2, DType::i32, ReduceOp::Avg, 1.0, out.data());
  CHECK(out[1] == 1);  // 3 / 2 truncated
  std::vector<int32_t> small = {-3, 4, 5, -6};
  reduce_in_rank_order(small.data(), 2, 2, DType::i32, ReduceOp::Avg, 1.0, out.data());
  CHECK(out[0] == 1);   // (-3 + 5) / 2
  CHECK(out[1] == -1);  // (4 - 6) / 2
  reduce_in_rank_order(small.data(), 2, 2, DType::i32, ReduceOp::Sum, 3.0, out.data());
  CHECK(out[0] == 6);
  CHECK(out[1] == -6);
  reduce_in_rank_order(small.data(), 2, 2, DType::i32, ReduceOp::Max, 1.0, out.data());
  CHECK(out == std::vector<int32_t>{5, 4});
  reduce_in_rank_order(small.data(), 2, 2, DType::i32, ReduceOp::Min, 1.0, out.data());
  CHECK(out == std::vector<int32_t>{-3, -6});
  std::vector<uint8_t> bytes = {200, 100};
  uint8_t b = 0;
  reduce_in_rank_order(bytes.data(), 2, 1, DType::u8, ReduceOp::Sum, 1.0, &b);
  CHECK(b == uint8_t(300 % 256));
}

TEST_CASE("f16 and one rank") {
  std::vector<f16> blocks = {f16(1.5f), f16(-2.25f)};
  std::vector<f16> out(2);
  reduce_in_rank_order(blocks.data(), 1, 2, DType::f16, ReduceOp::Avg, 2.0, out.data());
  CHECK(float(out[0]) == 3.0f);
  CHECK(float(out[1]) == -4.5f);
}

}  // namespace
}  // namespace fsdp
