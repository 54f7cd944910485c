// Dispatch of the per-block reductions (kernels/block_reduce.h).
#include "kernels/block_reduce.h"

#include "kernels/cpu/block_reduce.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/block_reduce.h"
#endif

namespace fsdp::ops {

Tensor block_sum_squares(Context& ctx, const Tensor& x, int64_t block) {
  check_defined(x, "block_sum_squares");
  FSDP_CHECK(x.device() == ctx.device(), DeviceError, "block_sum_squares: ", x.str(),
             " is not on ", ctx.device().str());
  FSDP_CHECK(x.is_contiguous(), ShapeError, "block_sum_squares needs a contiguous tensor");
  FSDP_CHECK(block > 0 && x.numel() % block == 0, ShapeError, "block_sum_squares: ", x.numel(),
             " elements are not a multiple of the block size ", block);
  FSDP_CHECK(is_floating(x.dtype()), DTypeError, "block_sum_squares: floating tensor expected");
  const int64_t nblocks = x.numel() / block;
  const DType out_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = ctx.empty(Shape{nblocks}, out_dtype);
  if (nblocks == 0) return out;
  if (x.device().is_cpu()) {
    kernels::cpu::block_sum_squares(x.data_ptr(), x.dtype(), nblocks, block, out.data_ptr());
    return out;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::block_sum_squares(x.data_ptr(), x.dtype(), nblocks, block, out.data_ptr(),
                                   ctx.stream().cuda_stream());
#endif
  return out;
}

}  // namespace fsdp::ops
