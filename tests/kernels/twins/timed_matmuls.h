// Twin cases whose CUDA side times cuBLASLt's candidates (kernels/cuda/matmul.h:
// MatmulTuning) on the first call of each problem: the results must still be the untimed
// ones, and what the timing recorded is checked at the case's end.
#pragma once

#include "tests/kernels/twin_harness.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::testing {

class TimedMatmuls {
 public:
  // Timing on for the CUDA side's problems from their first call, FP8 ones too when `fp8`
  // (the reference side times nothing).
  TimedMatmuls(TwinSide& s, bool fp8) : fp8_(fp8) {
#if FSDP_WITH_CUDA
    if (s.is_reference()) return;
    blas_ = &s.ctx().extension<kernels::cuda::Blas>();
    kernels::cuda::MatmulTuning tuning;
    tuning.enabled = true;
    tuning.after_uses = 1;
    tuning.fp8 = fp8;
    blas_->set_tuning(tuning);
#else
    (void)s;
#endif
  }

  // At least `problems` were timed (FP8 ones, when fp8), each keeping the fastest of its
  // candidates; timing is off again for the other cases.
  void check(TwinSide& s, int problems) {
#if FSDP_WITH_CUDA
    if (!blas_) return;
    int timed = 0;
    for (const kernels::cuda::MatmulTuningRecord& r : blas_->tuning_records()) {
      timed += !fp8_ || r.fp8;
      s.expect(r.candidates >= 1 && r.best_ms > 0 && r.best_ms <= r.heuristic_ms,
               "a timed problem keeps the fastest of its candidates");
    }
    s.expect(timed >= problems, "each problem was timed on its first call");
    blas_->set_tuning(kernels::cuda::MatmulTuning{});
#else
    (void)s;
    (void)problems;
#endif
  }

 private:
#if FSDP_WITH_CUDA
  kernels::cuda::Blas* blas_ = nullptr;
#endif
  bool fp8_;
};

}  // namespace fsdp::testing
