// Dispatch of Muon's Newton-Schulz orthogonalization (kernels/newton_schulz.h).
#include "kernels/newton_schulz.h"

#include "kernels/checks.h"
#include "kernels/cpu/newton_schulz.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/newton_schulz.h"
#endif

namespace fsdp::ops {

using namespace detail;

void newton_schulz(Context& ctx, const Tensor& x, const Tensor& out, const NewtonSchulzScalars& s) {
  const char* what = "newton_schulz";
  check_on_ctx(ctx, x, what);
  check_on_ctx(ctx, out, what);
  check_floating(x, what);
  check_floating(out, what);
  check_contiguous(x, what);
  check_contiguous(out, what);
  FSDP_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, what,
             ": matrices (rows, cols) or (batch, rows, cols) expected, got ", x.str());
  check_shape(out, x.shape(), what);
  FSDP_CHECK(s.steps >= 0 && s.eps > 0, ValueError, what, ": steps >= 0 and eps > 0, got ",
             s.steps, " and ", s.eps);
  kernels::NewtonSchulzDims d;
  d.batch = x.dim() == 3 ? x.size(0) : 1;
  d.rows = x.size(x.dim() - 2);
  d.cols = x.size(x.dim() - 1);
  if (ctx.device().is_cpu()) {
    kernels::cpu::newton_schulz(d, x.data_ptr(), x.dtype(), out.data_ptr(), out.dtype(), s);
    return;
  }
#if FSDP_WITH_CUDA
  FSDP_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, DTypeError, what,
             ": CUDA orthogonalizes f32 or bf16 matrices (in bf16), got ", x.str());
  ScratchTensors scratch(ctx);
  kernels::cuda::newton_schulz(ctx.extension<kernels::cuda::Blas>(), d, x.data_ptr(), x.dtype(),
                               out.data_ptr(), out.dtype(), s,
                               scratch(kernels::cuda::newton_schulz_workspace(d)),
                               ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
