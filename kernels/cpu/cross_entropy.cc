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
      // The target's column in this row (outside [0, Vp) when a shard does not hold it).
      const int64_t target = targets[n], column = target - d.vocab_begin;
      const int64_t live = d.live_columns();
      for (int64_t c = 0; c < d.padded_vocab; ++c) {
        if (target < 0 || c >= live) {
          dx[c] = T(0);
          continue;
        }
        const double p = std::exp(double(x[c]) - log_sum);
        dx[c] = T((p - (c == column ? 1.0 : 0.0)) * dloss);
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

void cross_entropy_shard_stats(const CrossEntropyDims& d, void* partials, const void* logits,
                               const int32_t* targets) {
  dispatch_compute(d.dtype, "cross_entropy_shard_stats", [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(partials);  // (3, rows)
    const int64_t live = d.live_columns();
    for (int64_t n = 0; n < d.rows; ++n) {
      check_target(targets[n], n, d.vocab, "cross_entropy_shard_stats");
      const T* x = static_cast<const T*>(logits) + n * d.padded_vocab;  // (Vp)
      double m = -INFINITY;
      for (int64_t c = 0; c < live; ++c) m = std::max(m, double(x[c]));
      double sum = 0;
      for (int64_t c = 0; c < live; ++c) sum += std::exp(double(x[c]) - m);
      const int64_t column = targets[n] - d.vocab_begin;
      const bool held = targets[n] >= 0 && column >= 0 && column < live;
      out[n] = T(m);
      out[d.rows + n] = T(sum);
      out[2 * d.rows + n] = held ? x[column] : T(0);
    }
  });
}

void cross_entropy_merge_shards(int64_t rows, int64_t shards, DType dtype, void* losses,
                                void* lse, const void* partials, const int32_t* targets) {
  dispatch_compute(dtype, "cross_entropy_merge_shards", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(partials);  // (shards, 3, rows)
    for (int64_t n = 0; n < rows; ++n) {
      double m = -INFINITY;
      for (int64_t s = 0; s < shards; ++s) m = std::max(m, double(p[s * 3 * rows + n]));
      double sum = 0, target_logit = 0;
      for (int64_t s = 0; s < shards; ++s) {
        const T* q = p + s * 3 * rows;
        if (double(q[n]) != -INFINITY) sum += double(q[rows + n]) * std::exp(double(q[n]) - m);
        target_logit += double(q[2 * rows + n]);
      }
      const double log_sum = m + std::log(sum);
      static_cast<T*>(lse)[n] = T(log_sum);
      static_cast<T*>(losses)[n] = targets[n] < 0 ? T(0) : T(log_sum - target_logit);
    }
  });
}

}  // namespace fsdp::kernels::cpu
