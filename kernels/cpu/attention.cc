#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/float_types.h"

namespace fsdp::kernels::cpu {
namespace {

// Row t of head h of batch b in a (B, T, heads, D) tensor.
template <typename P>
P* head_row(P* base, const HeadStrides& s, int64_t b, int64_t t, int64_t h) {
  return base + b * s.b + t * s.t + h * s.h;
}

template <typename T>
double dot(const T* x, const T* y, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(y[i]);
  return acc;
}

// Scaled scores of query row qt against keys 0..last of one key/value head, into s[0..last]
// (the causal mask, or with d.causal false all keys, is the caller's choice of last).
template <typename T>
void causal_scores(const AttentionDims& d, const T* qt, const T* k, int64_t b, int64_t kvh,
                   int64_t last, std::vector<double>& s) {
  for (int64_t j = 0; j <= last; ++j)
    s[size_t(j)] = d.scale * dot(qt, head_row(k, d.k, b, j, kvh), d.head_dim);
}

}  // namespace

void attention_forward(const AttentionDims& d, void* out, void* lse, const void* q, const void* k,
                       const void* v, DType dtype) {
  dispatch_compute(dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* qs = static_cast<const T*>(q);
    const T* ks = static_cast<const T*>(k);
    const T* vs = static_cast<const T*>(v);
    const int64_t D = d.head_dim, pairs = d.batch * d.heads;
#pragma omp parallel for schedule(static) if ((d.past + d.seq) * d.seq * D * pairs > (1 << 20))
    for (int64_t bh = 0; bh < pairs; ++bh) {
      const int64_t b = bh / d.heads, h = bh % d.heads, kvh = h / d.group();
      std::vector<double> s(static_cast<size_t>(d.past + d.seq)), acc(static_cast<size_t>(D));
      for (int64_t t = 0; t < d.seq; ++t) {
        const int64_t last = d.last_key(t);
        causal_scores(d, head_row(qs, d.q, b, t, h), ks, b, kvh, last, s);
        const double m = *std::max_element(s.begin(), s.begin() + last + 1);
        double sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += std::exp(s[size_t(j)] - m);
        const double log_sum = m + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= last; ++j) {
          const double p = std::exp(s[size_t(j)] - log_sum);
          const T* vj = head_row(vs, d.v, b, j, kvh);
          for (int64_t i = 0; i < D; ++i) acc[size_t(i)] += p * double(vj[i]);
        }
        T* o = head_row(static_cast<T*>(out), d.out, b, t, h);
        for (int64_t i = 0; i < D; ++i) o[i] = T(acc[size_t(i)]);
        static_cast<T*>(lse)[(b * d.heads + h) * d.seq + t] = T(log_sum);
      }
    }
  });
}

// With p = softmax row (from the saved lse), dP_j = dout . v_j and Delta = dout . out:
//   dS_j = p_j (dP_j - Delta);  dq = scale sum_j dS_j k_j;
//   dk_j += scale dS_j q;       dv_j += p_j dout   (summed over the heads sharing k/v).
void attention_backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                        const void* out, const void* lse, const void* q, const void* k,
                        const void* v, DType dtype) {
  dispatch_compute(dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* qs = static_cast<const T*>(q);
    const T* ks = static_cast<const T*>(k);
    const T* vs = static_cast<const T*>(v);
    const T* os = static_cast<const T*>(out);
    const T* gs = static_cast<const T*>(dout);
    const T* ls = static_cast<const T*>(lse);
    // Queries t in [0, T_) sit after d.past keys: query t sees keys 0 .. past + t of L.
    const int64_t D = d.head_dim, T_ = d.seq, L = d.past + d.seq, groups = d.batch * d.kv_heads;
#pragma omp parallel for schedule(static) if (L * T_ * D * d.batch * d.heads > (1 << 20))
    for (int64_t bg = 0; bg < groups; ++bg) {
      const int64_t b = bg / d.kv_heads, kvh = bg % d.kv_heads;
      std::vector<double> dk_acc(size_t(L * D), 0.0), dv_acc(size_t(L * D), 0.0);  // (L, D)
      std::vector<double> s(static_cast<size_t>(L)), dq_acc(static_cast<size_t>(D));
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
        for (int64_t t = 0; t < T_; ++t) {
          const int64_t last = d.last_key(t);
          const T* qt = head_row(qs, d.q, b, t, h);
          const T* gt = head_row(gs, d.dout, b, t, h);
          causal_scores(d, qt, ks, b, kvh, last, s);
          const double lse_t = double(ls[(b * d.heads + h) * T_ + t]);
          const double delta = dot(gt, head_row(os, d.out, b, t, h), D);
          std::fill(dq_acc.begin(), dq_acc.end(), 0.0);
          for (int64_t j = 0; j <= last; ++j) {
            const double p = std::exp(s[size_t(j)] - lse_t);
            const T* kj = head_row(ks, d.k, b, j, kvh);
            const T* vj = head_row(vs, d.v, b, j, kvh);
            const double ds = p * (dot(gt, vj, D) - delta);
            for (int64_t i = 0; i < D; ++i) {
              dq_acc[size_t(i)] += d.scale * ds * double(kj[i]);
              dk_acc[size_t(j * D + i)] += d.scale * ds * double(qt[i]);
              dv_acc[size_t(j * D + i)] += p * double(gt[i]);
            }
          }
          T* dqt = head_row(static_cast<T*>(dq), d.dq, b, t, h);
          for (int64_t i = 0; i < D; ++i) dqt[i] = T(dq_acc[size_t(i)]);
        }
      }
      for (int64_t j = 0; j < L; ++j) {
        T* dkj = head_row(static_cast<T*>(dk), d.dk, b, j, kvh);
        T* dvj = head_row(static_cast<T*>(dv), d.dv, b, j, kvh);
        for (int64_t i = 0; i < D; ++i) {
          dkj[i] = T(dk_acc[size_t(j * D + i)]);
          dvj[i] = T(dv_acc[size_t(j * D + i)]);
        }
      }
    }
  });
}

void attention_merge(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, void* out,
                     void* lse, const void* block_out, const void* block_lse, DType dtype) {
  dispatch_compute(dtype, "attention_merge", [&](auto tag) {
    using T = decltype(tag);  // CPU statistics have the compute dtype (f32 or f64)
    T* o = static_cast<T*>(out);
    T* l = static_cast<T*>(lse);
    const T* bo = static_cast<const T*>(block_out);
    const T* bl = static_cast<const T*>(block_lse);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < seq; ++t) {
          const int64_t row = (b * heads + h) * seq + t;
          const double a = double(l[row]), c = double(bl[row]);
          const double m = std::max(a, c);
          if (m == -INFINITY) continue;  // neither has a key yet
          const double merged = m + std::log(std::exp(a - m) + std::exp(c - m));
          const double wa = std::exp(a - merged), wc = std::exp(c - merged);
          T* orow = o + ((b * seq + t) * heads + h) * head_dim;
          const T* brow = bo + ((b * seq + t) * heads + h) * head_dim;
          for (int64_t i = 0; i < head_dim; ++i) orow[i] = T(double(orow[i]) * wa + double(brow[i]) * wc);
          l[row] = T(merged);
        }
  });
}

}  // namespace fsdp::kernels::cpu
