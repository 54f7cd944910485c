#include "kernels/cpu/fp8_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {
namespace {

int64_t at(const HeadStrides& s, int64_t b, int64_t t, int64_t h) { return b * s.b + t * s.t + h * s.h; }

float round_fp8(float x, Fp8Format f) { return fp8_decode(fp8_encode(x, f), f); }

// Stores x * scale at element i of an FP8 or a bf16 tensor (whose scale is 1).
void store(void* p, int64_t i, float x, bool fp8, Fp8Format f, float scale) {
  if (fp8)
    static_cast<uint8_t*>(p)[i] = fp8_encode(x * scale, f);
  else
    static_cast<bf16*>(p)[i] = bf16(x * scale);
}

// Each query's scores against its keys 0..t: (Q K^T) * softmax_scale * dq * dk.
void scores(const AttentionDims& d, const uint8_t* q, const uint8_t* k, const float* s,
            Fp8Format f, int64_t b, int64_t h, int64_t t, std::vector<float>& out) {
  const int64_t kh = h / d.group();
  for (int64_t j = 0; j <= t; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < d.head_dim; ++c)
      dot += double(fp8_decode(q[at(d.q, b, t, h) + c], f)) * fp8_decode(k[at(d.k, b, j, kh) + c], f);
    out[j] = float(dot) * float(d.scale) * s[kFp8DescaleQ] * s[kFp8DescaleK];
  }
}

}  // namespace

void attention_forward_fp8(const AttentionDims& d, const Fp8AttentionTypes& types, void* out,
                           float* lse, const uint8_t* q, const uint8_t* k, const uint8_t* v,
                           const float* s, float* amaxes) {
  const Fp8Format f = types.forward;
  float amax_s = 0, amax_o = 0;
  std::vector<float> x(d.seq), p8(d.seq);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t t = 0; t < d.seq; ++t) {
        scores(d, q, k, s, f, b, h, t, x);
        const float m = *std::max_element(x.begin(), x.begin() + t + 1);
        double z = 0;
        for (int64_t j = 0; j <= t; ++j) z += std::exp(double(x[j] - m));
        lse[(b * d.heads + h) * d.seq + t] = m + float(std::log(z));
        for (int64_t j = 0; j <= t; ++j) {
          const float p = float(std::exp(double(x[j] - m)) / z);
          amax_s = std::max(amax_s, p);
          p8[j] = round_fp8(p * s[kFp8ScaleS], f);
        }
        const int64_t kh = h / d.group();
        for (int64_t c = 0; c < d.head_dim; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j) acc += double(p8[j]) * fp8_decode(v[at(d.v, b, j, kh) + c], f);
          const float o = float(acc) * s[kFp8DescaleS] * s[kFp8DescaleV];
          amax_o = std::max(amax_o, std::fabs(o));
          store(out, at(d.out, b, t, h) + c, o, types.out_fp8, f, s[kFp8ScaleO]);
        }
      }
  amaxes[kFp8AmaxS] = amax_s;
  amaxes[kFp8AmaxO] = amax_o;
}

void attention_backward_fp8(const AttentionDims& d, const Fp8AttentionTypes& types, void* dq,
                            void* dk, void* dv, const uint8_t* dout, const uint8_t* out,
                            const float* lse, const uint8_t* q, const uint8_t* k,
                            const uint8_t* v, const float* s, float* amaxes) {
  const Fp8Format f = types.forward, g = types.backward;
  const int64_t B = d.batch, T = d.seq, H = d.heads, Hkv = d.kv_heads, D = d.head_dim;
  // dK and dV summed over each head group in double before they are stored.
  std::vector<double> dk_acc(B * T * Hkv * D, 0.0), dv_acc(B * T * Hkv * D, 0.0);
  auto kv_index = [&](int64_t b, int64_t j, int64_t kh, int64_t c) { return ((b * T + j) * Hkv + kh) * D + c; };
  float amax_ds = 0, amax_dq = 0, amax_dk = 0, amax_dv = 0;
  std::vector<float> x(T), p(T), ds8(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / d.group();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = at(d.dout, b, t, h), orow = at(d.out, b, t, h), qrow = at(d.q, b, t, h);
        double delta = 0;
        for (int64_t c = 0; c < D; ++c)
          delta += double(fp8_decode(dout[row + c], g)) * fp8_decode(out[orow + c], f);
        const float delta_f = float(delta) * s[kFp8DescaleDO] * s[kFp8DescaleO];
        scores(d, q, k, s, f, b, h, t, x);
        for (int64_t j = 0; j <= t; ++j) {
          p[j] = float(std::exp(double(x[j] - lse[(b * H + h) * T + t])));
          const float p8 = round_fp8(p[j] * s[kFp8ScaleS], f);
          for (int64_t c = 0; c < D; ++c)  // dV += fp8(P)^T dO
            dv_acc[kv_index(b, j, kh, c)] += double(p8) * fp8_decode(dout[row + c], g);
          double dp = 0;
          for (int64_t c = 0; c < D; ++c)
            dp += double(fp8_decode(dout[row + c], g)) * fp8_decode(v[at(d.v, b, j, kh) + c], f);
          const float dpf = float(dp) * s[kFp8DescaleDO] * s[kFp8DescaleV];
          const float ds = (dpf - delta_f) * p[j] * float(d.scale);
          amax_ds = std::max(amax_ds, std::fabs(ds));
          ds8[j] = round_fp8(ds * s[kFp8ScaleDS], g);
        }
        for (int64_t c = 0; c < D; ++c) {  // dQ = fp8(dS) K
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j) acc += double(ds8[j]) * fp8_decode(k[at(d.k, b, j, kh) + c], f);
          const float value = float(acc) * s[kFp8DescaleDS] * s[kFp8DescaleK];
          amax_dq = std::max(amax_dq, std::fabs(value));
          store(dq, at(d.dq, b, t, h) + c, value, types.grads_fp8, g, s[kFp8ScaleDQ]);
        }
        for (int64_t j = 0; j <= t; ++j)  // dK += fp8(dS)^T Q
          for (int64_t c = 0; c < D; ++c)
            dk_acc[kv_index(b, j, kh, c)] += double(ds8[j]) * fp8_decode(q[qrow + c], f);
      }
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < T; ++j)
      for (int64_t kh = 0; kh < Hkv; ++kh)
        for (int64_t c = 0; c < D; ++c) {
          const float kv = float(dk_acc[kv_index(b, j, kh, c)]) * s[kFp8DescaleDS] * s[kFp8DescaleQ];
          const float vv = float(dv_acc[kv_index(b, j, kh, c)]) * s[kFp8DescaleS] * s[kFp8DescaleDO];
          amax_dk = std::max(amax_dk, std::fabs(kv));
          amax_dv = std::max(amax_dv, std::fabs(vv));
          store(dk, at(d.dk, b, j, kh) + c, kv, types.grads_fp8, g, s[kFp8ScaleDK]);
          store(dv, at(d.dv, b, j, kh) + c, vv, types.grads_fp8, g, s[kFp8ScaleDV]);
        }
  amaxes[kFp8AmaxDS] = amax_ds;
  amaxes[kFp8AmaxDQ] = amax_dq;
  amaxes[kFp8AmaxDK] = amax_dk;
  amaxes[kFp8AmaxDV] = amax_dv;
}

}  // namespace fsdp::kernels::cpu
