#include "kernels/cpu/cross_entropy.h"

#include <cmath>

#include "kernels/cpu/float_types.h"

namespace fsdp::kernels::cpu {
namespace {

void check_target(int64_t target, int64_t row, int64_t vocab, const char* what) {
  FSDP_CHECK(target == -1 || (target >= 0 && target < vocab), IndexError, what, ": target ",
             target, " of row ", row, " is outside [0, ", vocab, ") and is not -1 (ignored)");
}

}  // namespace

void cross_entropy_forward(const CrossEntropyDims& d, void* losses, void* lse, const void* logits,
                           const int32_t* targets) {
  dispatch_compute(d.dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t n = 0; n < d.rows; ++n) {
      check_target(targets[n], n, d.vocab, "cross_entropy_forward");
      const T* x = static_cast<const T*>(logits) + n * d.padded_vocab;  // (Vp)
      double m = -INFINITY;
      for (int64_t c = 0; c < d.vocab; ++c) m = std::max(m, double(x[c]));
      double sum = 0;
      for (int64_t c = 0; c < d.vocab; ++c) sum += std::exp(double(x[c]) - m);
      const double log_sum = m + std::log(sum);
      static_cast<T*>(lse)[n] = T(log_sum);
      static_cast<T*>(losses)[n] = targets[n] < 0 ? T(0) : T(log_sum - double(x[targets[n]]));
    }
  });
}

void cross_entropy_backward(const CrossEntropyDims& d, void* dlogits, const void* logits,
                            const void* lse, const int32_t* targets, double dloss) {
  dispatch_compute(d.dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t n = 0; n < d.rows; ++n) {
      check_target(targets[n], n, d.vocab, "cross_entropy_backward");
      const T* x = static_cast<const T*>(logits) + n * d.padded_vocab;  // (Vp)
      T* dx = static_cast<T*>(dlogits) + n * d.padded_vocab;           // may alias x
      const double log_sum = double(static_cast<const T*>(lse)[n]);
      const int64_t target = targets[n];
      for (int64_t c = 0; c < d.padded_vocab; ++c) {
        if (target < 0 || c >= d.vocab) {
          dx[c] = T(0);
          continue;
        }
        const double p = std::exp(double(x[c]) - log_sum);
        dx[c] = T((p - (c == target ? 1.0 : 0.0)) * dloss);
      }
    }
  });
}

void cross_entropy_forward_backward(const CrossEntropyDims& d, void* losses, void* logits,
                                    const int32_t* targets, double dloss, bool write_grad) {
  dispatch_compute(d.dtype, "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    for (int64_t n = 0; n < d.rows; ++n) {
      check_target(targets[n], n, d.vocab, "cross_entropy_forward_backward");
      T* x = static_cast<T*>(logits) + n * d.padded_vocab;  // (Vp), becomes its gradient
      double m = -INFINITY;
      for (int64_t c = 0; c < d.vocab; ++c) m = std::max(m, double(x[c]));
      double sum = 0;
      for (int64_t c = 0; c < d.vocab; ++c) sum += std::exp(double(x[c]) - m);
      const double log_sum = m + std::log(sum);
      const int64_t target = targets[n];
      // The target's logit is read before the write pass below replaces it.
      static_cast<T*>(losses)[n] = target < 0 ? T(0) : T(log_sum - double(x[target]));
      if (!write_grad) continue;
      for (int64_t c = 0; c < d.padded_vocab; ++c) {
        if (target < 0 || c >= d.vocab) {
          x[c] = T(0);
          continue;
        }
        const double p = std::exp(double(x[c]) - log_sum);
        x[c] = T((p - (c == target ? 1.0 : 0.0)) * dloss);
      }
    }
  });
}

}  // namespace fsdp::kernels::cpu
