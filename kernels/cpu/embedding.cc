#include "kernels/cpu/embedding.h"

#include <vector>

#include "kernels/cpu/float_types.h"

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

}  // namespace fsdp::kernels::cpu
