// Dispatch of the rotary embeddings (kernels/rope.h).
#include "kernels/rope.h"

#include "kernels/checks.h"
#include "kernels/cpu/rope.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/rope.h"
#endif

namespace fsdp::ops {

using namespace detail;

void rope(Context& ctx, const Tensor& out, const Tensor& x, double theta, bool inverse,
          int64_t position_offset) {
  const char* what = "rope";
  check_on_ctx(ctx, x, what);
  check_on_ctx(ctx, out, what);
  check_floating(x, what);
  check_dtype(out, x.dtype(), what);
  check_shape(out, x.shape(), what);
  kernels::RopeDims d;
  d.x = head_strides(x, what);
  d.out = head_strides(out, what);
  FSDP_CHECK(x.size(3) % 2 == 0, ShapeError, what, ": the head dimension must be even, got ", x.str());
  FSDP_CHECK(theta > 0, ValueError, what, ": theta must be positive, got ", theta);
  FSDP_CHECK(position_offset >= 0, ValueError, what, ": negative position offset ", position_offset);
  // In place: the same elements (strides of size-1 dimensions never address anything).
  auto same_stride = [&](int64_t size, int64_t a, int64_t b) { return size == 1 || a == b; };
  const bool in_place = out.shares_storage(x) && out.offset() == x.offset() &&
                        same_stride(x.size(0), d.out.b, d.x.b) &&
                        same_stride(x.size(1), d.out.t, d.x.t) &&
                        same_stride(x.size(2), d.out.h, d.x.h);
  FSDP_CHECK(in_place || !out.shares_storage(x), ValueError, what, ": the output ", out.str(),
             " shares memory with the input ", x.str(), " without being it");
  d.batch = x.size(0);
  d.seq = x.size(1);
  d.heads = x.size(2);
  d.head_dim = x.size(3);
  d.theta = theta;
  d.inverse = inverse;
  d.position_offset = position_offset;
  if (ctx.device().is_cpu()) {
    kernels::cpu::rope(d, out.data_ptr(), x.data_ptr(), x.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  const Tensor workspace =
      ctx.empty(Shape{int64_t(kernels::cuda::rope_workspace_bytes(d))}, DType::u8);
  kernels::cuda::rope(d, out.data_ptr(), x.data_ptr(), x.dtype(), workspace.data_ptr(),
                      ctx.stream().cuda_stream());
#endif
}

void rope_apply(Context& ctx, const Tensor& x, double theta, bool inverse,
                int64_t position_offset) {
  rope(ctx, x, x, theta, inverse, position_offset);
}

}  // namespace fsdp::ops
