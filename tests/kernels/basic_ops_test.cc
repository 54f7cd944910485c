// The basic ops on the CPU (semantics), and the device checks of the dispatch. The CUDA
// kernels against their CPU twins: tests/kernels/twins/basic_twins.cc.
#include <cmath>

#include "kernels/ops.h"
#include "tests/test_support.h"

using namespace fsdp;

TEST_CASE("fill, copy, cast and contiguous on the CPU", "[kernels]") {
  Context ctx;
  Tensor t = ops::full(ctx, Shape{2, 3}, DType::f32, 1.5);
  CHECK(ops::to_vector<float>(ctx, t) == std::vector<float>(6, 1.5f));

  Tensor a = ops::from_host<float>(ctx, {0, 1, 2, 3, 4, 5}, Shape{2, 3});
  Tensor at = ops::contiguous(ctx, a.transpose(0, 1));
  CHECK(at.is_contiguous());
  CHECK(at.shape() == Shape{3, 2});
  CHECK(ops::to_vector<float>(ctx, at) == std::vector<float>{0, 3, 1, 4, 2, 5});

  // Fill through a strided view touches only the view's elements.
  ops::fill(ctx, a.slice(1, 1, 3), -1.0);
  CHECK(ops::to_vector<float>(ctx, a) == std::vector<float>{0, -1, -1, 3, -1, -1});

  // Casts round to nearest even and convert integers.
  Tensor x = ops::from_host<float>(ctx, {1.0f + 1.0f / 256, 2.7f, -2.7f}, Shape{3});
  Tensor xb = ops::cast(ctx, x, DType::bf16);
  CHECK(float(xb.data<bf16>()[0]) == 1.0f);
  Tensor xi = ops::cast(ctx, x, DType::i32);
  CHECK(ops::to_vector<int32_t>(ctx, xi) == std::vector<int32_t>{1, 2, -2});
  Tensor back = ops::cast(ctx, ops::from_host<uint16_t>(ctx, {0, 65535}, Shape{2}), DType::f64);
  CHECK(ops::to_vector<double>(ctx, back) == std::vector<double>{0, 65535});

  // Strided copy between two views with different layouts and dtypes.
  Tensor dst = ops::zeros(ctx, Shape{3, 2}, DType::f64);
  ops::copy(ctx, dst.transpose(0, 1), ops::from_host<float>(ctx, {1, 2, 3, 4, 5, 6}, Shape{2, 3}));
  CHECK(ops::to_vector<double>(ctx, dst) == std::vector<double>{1, 4, 2, 5, 3, 6});

  CHECK(ops::reshape(ctx, a.transpose(0, 1), Shape{6}).shape() == Shape{6});
  CHECK_THROWS_AS(ops::copy(ctx, dst, ops::zeros(ctx, Shape{5}, DType::f32)), ShapeError);
}

TEST_CASE("elementwise arithmetic and its checks on the CPU", "[kernels]") {
  Context ctx;
  Tensor a = ops::from_host<float>(ctx, {1, 2, 3}, Shape{3});
  Tensor b = ops::from_host<float>(ctx, {4, 5, 6}, Shape{3});
  Tensor out = ops::empty(ctx, Shape{3}, DType::f32);
  ops::add(ctx, out, a, b);
  CHECK(ops::to_vector<float>(ctx, out) == std::vector<float>{5, 7, 9});
  ops::sub(ctx, out, a, b);
  CHECK(ops::to_vector<float>(ctx, out) == std::vector<float>{-3, -3, -3});
  ops::mul(ctx, out, a, b);
  CHECK(ops::to_vector<float>(ctx, out) == std::vector<float>{4, 10, 18});
  ops::scale(ctx, out, a, -2.0);
  CHECK(ops::to_vector<float>(ctx, out) == std::vector<float>{-2, -4, -6});
  // In place: out aliases a.
  ops::add(ctx, a, a, b);
  CHECK(ops::to_vector<float>(ctx, a) == std::vector<float>{5, 7, 9});

  // axpby accumulates a bf16 x into an f32 y.
  Tensor y = ops::from_host<float>(ctx, {1, 1, 1}, Shape{3});
  Tensor xb = ops::cast(ctx, ops::from_host<float>(ctx, {0.5f, 1.5f, -2}, Shape{3}), DType::bf16);
  ops::axpby(ctx, y, 2.0, xb, 1.0);
  CHECK(ops::to_vector<float>(ctx, y) == std::vector<float>{2, 4, -3});
  // beta = 0 ignores whatever y held, NaN included.
  ops::fill(ctx, y, NAN);
  ops::axpby(ctx, y, 1.0, xb, 0.0);
  CHECK(ops::to_vector<float>(ctx, y) == std::vector<float>{0.5f, 1.5f, -2});

  CHECK_THROWS_AS(ops::add(ctx, out, a, ops::zeros(ctx, Shape{4}, DType::f32)), ShapeError);
  // b may have another dtype (a bf16 branch added to an f32 residual stream); out must
  // have a's.
  ops::add(ctx, out, a, xb);
  CHECK(ops::to_vector<float>(ctx, out) == std::vector<float>{5.5f, 8.5f, 7});
  CHECK_THROWS_AS(ops::add(ctx, ops::zeros(ctx, Shape{3}, DType::f64), a, b), DTypeError);
  CHECK_THROWS_AS(ops::add(ctx, ops::zeros(ctx, Shape{3}, DType::i32), ops::zeros(ctx, Shape{3}, DType::i32),
                           ops::zeros(ctx, Shape{3}, DType::i32)),
                  DTypeError);
}

TEST_CASE("reductions on the CPU", "[kernels]") {
  Context ctx;
  Tensor a = ops::from_host<float>(ctx, {3, -4, 1, 0.5f}, Shape{2, 2});
  CHECK(ops::item(ctx, ops::sum(ctx, a)) == 0.5);
  CHECK(ops::item(ctx, ops::sum_squares(ctx, a)) == 26.25);
  CHECK(ops::item(ctx, ops::max(ctx, a)) == 3);
  CHECK(ops::item(ctx, ops::min(ctx, a)) == -4);
  CHECK(ops::item(ctx, ops::max_abs(ctx, a)) == 4);
  // A NaN anywhere is reported, never hidden by max.
  a.data<float>()[2] = NAN;
  CHECK(std::isnan(ops::item(ctx, ops::max(ctx, a))));
  CHECK(std::isnan(ops::item(ctx, ops::max_abs(ctx, a))));
  // Strided input.
  Tensor b = ops::from_host<double>(ctx, {1, 2, 3, 4}, Shape{2, 2});
  CHECK(ops::item(ctx, ops::sum(ctx, b.slice(1, 0, 1))) == 4.0);
}

TEST_CASE("wrong devices are refused", "[kernels][gpu]") {
  FSDP_REQUIRE_GPU();
  Context gpu(Device::cuda(0));
  Context cpu;
  Tensor h = ops::zeros(cpu, Shape{3}, DType::f32);
  Tensor d = ops::zeros(gpu, Shape{3}, DType::f32);
  CHECK_THROWS_AS(ops::add(gpu, d, d, h), DeviceError);
  CHECK_THROWS_AS(ops::fill(cpu, d, 1.0), DeviceError);
}
