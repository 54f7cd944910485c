#include "kernels/cpu/embedding.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cpu {

void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe) {
  dispatch_compute(d.dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.channels;
    for (int64_t bt = 0; bt < d.batch * d.seq; ++bt) {
      const int64_t token = idx[bt], t = bt % d.seq, local = token - d.vocab_begin;
      FSDP_CHECK(token >= 0 && token < d.vocab_total, IndexError, "embedding_forward: token id ",
                 token, " at position ", bt, " is outside the vocabulary [0, ", d.vocab_total, ")");
      // A shard that does not hold the token gives a zero row (plus the position).
      const bool held = local >= 0 && local < d.vocab;
      const T* row = static_cast<const T*>(wte) + local * C;  // (C)
      const T* pos = wpe ? static_cast<const T*>(wpe) + t * C : nullptr;
      T* o = static_cast<T*>(out) + bt * C;
      for (int64_t c = 0; c < C; ++c) {
        const T e = held ? row[c] : T(0);
        o[c] = pos ? T(e + pos[c]) : e;
      }
    }
  });
}

void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx) {
  dispatch_compute(d.dtype, "embedding_backward", [&](auto ttag) {
    using T = decltype(ttag);
    dispatch_compute(d.grad_dtype, "embedding_backward gradient", [&](auto gtag) {
      using G = decltype(gtag);
      const int64_t C = d.channels;
      const T* g = static_cast<const T*>(dout);
      if (dwte) {
        // Every id is checked before any gradient changes: an error leaves dwte untouched.
        for (int64_t bt = 0; bt < d.batch * d.seq; ++bt)
          FSDP_CHECK(idx[bt] >= 0 && idx[bt] < d.vocab_total, IndexError,
                     "embedding_backward: token id ", idx[bt], " at position ", bt,
                     " is outside the vocabulary [0, ", d.vocab_total, ")");
        G* dw = static_cast<G*>(dwte);
        for (int64_t bt = 0; bt < d.batch * d.seq; ++bt) {
          const int64_t local = idx[bt] - d.vocab_begin;
          if (local < 0 || local >= d.vocab) continue;  // another shard's row
          for (int64_t c = 0; c < C; ++c)
            store_or_add(dw[local * C + c], double(g[bt * C + c]), true);
        }
      }
      if (dwpe) {
        std::vector<double> sums(size_t(d.seq * C), 0.0);  // (T, C)
        for (int64_t b = 0; b < d.batch; ++b)
          for (int64_t i = 0; i < d.seq * C; ++i) sums[size_t(i)] += double(g[b * d.seq * C + i]);
        G* dp = static_cast<G*>(dwpe);
        for (int64_t i = 0; i < d.seq * C; ++i) store_or_add(dp[i], sums[size_t(i)], true);
      }
    });
  });
}

void rope_apply(void* x, DType dtype, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                const HeadStrides& s, double theta, bool inverse, int64_t position_offset) {
  dispatch_compute(dtype, "rope_apply", [&](auto tag) {
    using T = decltype(tag);
    const int64_t half = head_dim / 2;
    const double sign = inverse ? -1.0 : 1.0;
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(position_offset + t) * rope_inv_freq(i, head_dim, theta);
        const double c = std::cos(angle), sn = sign * std::sin(angle);
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t h = 0; h < heads; ++h) {
            T* v = static_cast<T*>(x) + b * s.b + t * s.t + h * s.h;  // (D)
            const double x1 = double(v[i]), x2 = double(v[i + half]);
            v[i] = T(x1 * c - x2 * sn);
            v[i + half] = T(x2 * c + x1 * sn);
          }
        }
      }
    }
  });
}

}  // namespace fsdp::kernels::cpu
