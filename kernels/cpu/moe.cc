#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cpu {
namespace {

// The statistics type beside compute type T: double for double, float otherwise.
template <typename T>
using StatsOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Row `n`'s scores (E) in double: the softmax of the logits, or their sigmoids.
template <typename T>
void row_scores(const RouterDims& d, const T* logits, std::vector<double>& s) {
  const int64_t E = d.experts;
  if (d.score == RouterScore::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = sigmoid(double(logits[e]));
    return;
  }
  double m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::fmax(m, double(logits[e]));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    s[size_t(e)] = std::exp(double(logits[e]) - m);
    sum += s[size_t(e)];
  }
  for (int64_t e = 0; e < E; ++e) s[size_t(e)] /= sum;
}

// Checks indices (count values) lie in [0, experts) before anything is written.
void check_indices(const int32_t* indices, int64_t count, int64_t experts, const char* what) {
  for (int64_t i = 0; i < count; ++i)
    FSDP_CHECK(indices[i] >= 0 && indices[i] < experts, IndexError, what, ": expert index ",
               indices[i], " at position ", i, " is outside [0, ", experts, ")");
}

// Checks rows (count values) lie in [0, rows).
void check_rows(const int32_t* map, int64_t count, int64_t rows, const char* what) {
  for (int64_t i = 0; i < count; ++i)
    FSDP_CHECK(map[i] >= 0 && map[i] < rows, IndexError, what, ": row ", map[i],
               " at position ", i, " is outside [0, ", rows, ")");
}

}  // namespace

void moe_router_forward(const RouterDims& d, int32_t* indices, void* weights, void* scores,
                        const void* logits, const float* bias) {
  dispatch_compute(d.dtype, "moe_router_forward", [&](auto tag) {
    using T = decltype(tag);
    using S = StatsOf<T>;
    const int64_t E = d.experts, k = d.top_k;
    std::vector<double> s(static_cast<size_t>(E));
    std::vector<S> key(static_cast<size_t>(E));
    std::vector<bool> taken(static_cast<size_t>(E));
    for (int64_t n = 0; n < d.tokens; ++n) {
      row_scores(d, static_cast<const T*>(logits) + n * E, s);
      S* sr = static_cast<S*>(scores) + n * E;  // (E)
      for (int64_t e = 0; e < E; ++e) {
        sr[e] = S(s[size_t(e)]);
        key[size_t(e)] = router_key(sr[e], bias ? bias[e] : 0.f);
        taken[size_t(e)] = false;
      }
      // k passes, each taking the first expert in router order not taken yet.
      int32_t* ir = indices + n * k;  // (k)
      double chosen_sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[size_t(e)]) continue;
          if (best < 0 || router_before(key[size_t(e)], e, key[size_t(best)], best)) best = e;
        }
        taken[size_t(best)] = true;
        ir[j] = int32_t(best);
        chosen_sum += s[size_t(best)];
      }
      // The weights come from the unbiased scores, in double.
      const double z = d.normalize ? chosen_sum + kRouterNormEps : 1.0;
      S* wr = static_cast<S*>(weights) + n * k;
      for (int64_t j = 0; j < k; ++j) wr[j] = S(s[size_t(ir[j])] / z);
    }
  });
}

// With c_j the chosen scores and Z = sum c_j + eps, the normalized weights w_j = c_j / Z give
//   d c_j = (dw_j - sum_m dw_m w_m) / Z    (d c_j = dw_j without normalization),
// the score gradient ds_e = dscores_e + d c_j where e = i_j, and then
//   softmax: dlogit_e = s_e (ds_e - sum_f ds_f s_f);   sigmoid: dlogit_e = ds_e s_e (1 - s_e).
void moe_router_backward(const RouterDims& d, void* dlogits, const void* dweights,
                         const void* dscores, const void* scores, const int32_t* indices) {
  check_indices(indices, d.tokens * d.top_k, d.experts, "moe_router_backward");
  dispatch_compute(d.dtype, "moe_router_backward", [&](auto tag) {
    using T = decltype(tag);
    using S = StatsOf<T>;
    const int64_t E = d.experts, k = d.top_k;
    std::vector<double> ds(static_cast<size_t>(E));
    for (int64_t n = 0; n < d.tokens; ++n) {
      const S* sr = static_cast<const S*>(scores) + n * E;  // (E)
      const S* dw = static_cast<const S*>(dweights) + n * k;
      const int32_t* ir = indices + n * k;
      for (int64_t e = 0; e < E; ++e)
        ds[size_t(e)] = dscores ? double(static_cast<const S*>(dscores)[n * E + e]) : 0.0;
      double z = 0, weighted = 0;
      for (int64_t j = 0; j < k; ++j) z += double(sr[ir[j]]);
      z += kRouterNormEps;
      for (int64_t j = 0; j < k; ++j) weighted += double(dw[j]) * double(sr[ir[j]]) / z;
      for (int64_t j = 0; j < k; ++j)
        ds[size_t(ir[j])] += d.normalize ? (double(dw[j]) - weighted) / z : double(dw[j]);
      T* out = static_cast<T*>(dlogits) + n * E;
      if (d.score == RouterScore::Sigmoid) {
        for (int64_t e = 0; e < E; ++e) {
          const double se = double(sr[e]);
          out[e] = T(ds[size_t(e)] * se * (1.0 - se));
        }
      } else {
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += ds[size_t(e)] * double(sr[e]);
        for (int64_t e = 0; e < E; ++e) out[e] = T(double(sr[e]) * (ds[size_t(e)] - dot));
      }
    }
  });
}

// A counting sort: pairs p = n k + j in increasing order, each placed at its expert's next
// free row, so within an expert the rows keep (token, slot) order.
void moe_sort_by_expert(int64_t tokens, int64_t top_k, int64_t experts, int32_t* counts,
                        int32_t* source, int32_t* dest, const int32_t* indices) {
  const int64_t pairs = tokens * top_k;
  check_indices(indices, pairs, experts, "moe_sort_by_expert");
  std::vector<int64_t> next(size_t(experts), 0);  // (E): the next free row of each expert
  for (int64_t e = 0; e < experts; ++e) counts[e] = 0;
  for (int64_t p = 0; p < pairs; ++p) ++counts[indices[p]];
  for (int64_t e = 1; e < experts; ++e) next[size_t(e)] = next[size_t(e - 1)] + counts[e - 1];
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t r = next[size_t(indices[p])]++;
    source[r] = int32_t(p / top_k);
    dest[p] = int32_t(r);
  }
}

void moe_permute(const MoeRowsDims& d, void* x_sorted, const void* x, const int32_t* source) {
  check_rows(source, d.rows(), d.tokens, "moe_permute");
  dispatch_compute(d.dtype, "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.channels;
    for (int64_t r = 0; r < d.rows(); ++r) {
      const T* from = static_cast<const T*>(x) + int64_t(source[r]) * C;
      T* to = static_cast<T*>(x_sorted) + r * C;
      for (int64_t c = 0; c < C; ++c) to[c] = from[c];
    }
  });
}

void moe_permute_backward(const MoeRowsDims& d, void* dx, const void* dx_sorted,
                          const int32_t* dest, bool accumulate_dx) {
  check_rows(dest, d.rows(), d.rows(), "moe_permute_backward");
  dispatch_compute(d.dtype, "moe_permute_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.channels, k = d.top_k;
    std::vector<double> acc(static_cast<size_t>(C));
    for (int64_t n = 0; n < d.tokens; ++n) {
      for (int64_t c = 0; c < C; ++c) acc[size_t(c)] = 0;
      for (int64_t j = 0; j < k; ++j) {
        const T* g = static_cast<const T*>(dx_sorted) + int64_t(dest[n * k + j]) * C;
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += double(g[c]);
      }
      T* out = static_cast<T*>(dx) + n * C;
      for (int64_t c = 0; c < C; ++c) store_or_add(out[c], acc[size_t(c)], accumulate_dx);
    }
  });
}

void moe_unpermute(const MoeRowsDims& d, void* out, const void* y_sorted, const void* weights,
                   const int32_t* dest) {
  check_rows(dest, d.rows(), d.rows(), "moe_unpermute");
  dispatch_compute(d.dtype, "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    using S = StatsOf<T>;
    const int64_t C = d.channels, k = d.top_k;
    std::vector<double> acc(static_cast<size_t>(C));
    for (int64_t n = 0; n < d.tokens; ++n) {
      for (int64_t c = 0; c < C; ++c) acc[size_t(c)] = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double w = double(static_cast<const S*>(weights)[n * k + j]);
        const T* y = static_cast<const T*>(y_sorted) + int64_t(dest[n * k + j]) * C;
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += w * double(y[c]);
      }
      T* o = static_cast<T*>(out) + n * C;
      for (int64_t c = 0; c < C; ++c) o[c] = T(acc[size_t(c)]);
    }
  });
}

void moe_unpermute_backward(const MoeRowsDims& d, void* dy_sorted, void* dweights,
                            const void* dout, const void* y_sorted, const void* weights,
                            const int32_t* dest) {
  check_rows(dest, d.rows(), d.rows(), "moe_unpermute_backward");
  dispatch_compute(d.dtype, "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    using S = StatsOf<T>;
    const int64_t C = d.channels, k = d.top_k;
    for (int64_t n = 0; n < d.tokens; ++n) {
      const T* g = static_cast<const T*>(dout) + n * C;  // (C)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = dest[n * k + j];
        const double w = double(static_cast<const S*>(weights)[n * k + j]);
        const T* y = static_cast<const T*>(y_sorted) + r * C;
        T* dy = static_cast<T*>(dy_sorted) + r * C;
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          dot += double(g[c]) * double(y[c]);
          dy[c] = T(w * double(g[c]));
        }
        static_cast<S*>(dweights)[n * k + j] = S(dot);
      }
    }
  });
}

// ---------------------------------------------------------------- auxiliary losses

void moe_group_expert_counts(const MoeLossDims& d, int32_t* counts, const int32_t* indices) {
  const int64_t pairs = d.tokens * d.top_k, per_group = pairs / d.groups;
  check_indices(indices, pairs, d.experts, "moe_group_expert_counts");
  std::fill(counts, counts + d.groups * d.experts, 0);
  for (int64_t p = 0; p < pairs; ++p) counts[(p / per_group) * d.experts + indices[p]] += 1;
}

void moe_balancing_loss(const MoeLossDims& d, void* per_token, void* dscores, const void* scores,
                        const int32_t* indices, double coeff, const int32_t* run_counts) {
  dispatch_compute(d.dtype, "moe_balancing_loss", [&](auto tag) {
    using S = StatsOf<decltype(tag)>;
    const int64_t N = d.tokens, E = d.experts, k = d.top_k, n = N / d.groups;
    const int64_t whole = d.run_tokens > 0 ? d.run_tokens : n;  // the run's tokens everywhere
    check_indices(indices, N * k, E, "moe_balancing_loss");
    const double weight = 1.0 / double(d.groups);  // the mean over the runs
    std::vector<double> c(static_cast<size_t>(E));
    for (int64_t g = 0; g < d.groups; ++g) {
      // c_e = d loss / d P_e / n = E f_e / n = E count_e / (n n k): every token's score of e
      // counts 1 / n in P_e (n: the whole run's tokens).
      std::fill(c.begin(), c.end(), 0.0);
      if (run_counts) {
        for (int64_t e = 0; e < E; ++e) c[size_t(e)] = double(run_counts[g * E + e]);
      } else {
        for (int64_t i = g * n * k; i < (g + 1) * n * k; ++i) c[size_t(indices[i])] += 1.0;
      }
      for (double& ce : c) ce *= double(E) / (double(whole) * double(whole) * double(k));
      for (int64_t t = g * n; t < (g + 1) * n; ++t) {
        const S* s = static_cast<const S*>(scores) + t * E;  // (E)
        S* ds = static_cast<S*>(dscores) + t * E;             // (E)
        // Sigmoid scores do not sum to 1 over the experts: they are normalized per token
        // first (s_e / sum s), as Megatron does, so P_e is again a share of the token.
        double sum = 1.0;
        if (d.sigmoid) {
          sum = 0;
          for (int64_t e = 0; e < E; ++e) sum += double(s[e]);
          sum += 1e-20;
        }
        double dot = 0;  // sum_e c_e s_e / sum
        for (int64_t e = 0; e < E; ++e) dot += c[size_t(e)] * double(s[e]) / sum;
        static_cast<S*>(per_token)[t] = S(weight * dot);
        // d(s_e / S)/d s_j = [e == j] / S - s_e / S^2 (the second term only for sigmoid).
        for (int64_t e = 0; e < E; ++e)
          ds[e] = S(coeff * weight * (c[size_t(e)] / sum - (d.sigmoid ? dot / sum : 0.0)));
      }
    }
  });
}

void moe_z_loss(const MoeLossDims& d, void* per_token, void* dlogits, const void* logits,
                double coeff) {
  dispatch_compute(d.dtype, "moe_z_loss", [&](auto tag) {
    using T = decltype(tag);
    using S = StatsOf<T>;
    const int64_t N = d.tokens, E = d.experts;
    for (int64_t t = 0; t < N; ++t) {
      const T* l = static_cast<const T*>(logits) + t * E;  // (E)
      T* dl = static_cast<T*>(dlogits) + t * E;            // (E)
      double m = -INFINITY;
      for (int64_t e = 0; e < E; ++e) m = std::fmax(m, double(l[e]));
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(double(l[e]) - m);
      const double lse = m + std::log(s);
      static_cast<S*>(per_token)[t] = S(lse * lse / double(N));
      // d z / d logit_e = 2 lse softmax_e / N.
      for (int64_t e = 0; e < E; ++e)
        dl[e] = T(coeff * 2.0 * lse * std::exp(double(l[e]) - m) / s / double(N));
    }
  });
}

}  // namespace fsdp::kernels::cpu
