// Rotary position embeddings on CUDA, in two kernels. The angles depend only on the row's
// position and the pair, so the first kernel computes each (t, i)'s cosine and sine once
// (seq * D/2 of them, in double and reduced to [-pi, pi] before the f32 sincos), and the
// second streams the heads through it: each thread rotates W consecutive pairs of one head,
// with 16-byte loads and stores where the strides allow. The same f32 cosines and sines,
// and the same products, whichever layout or launch reads them.
#include "kernels/cuda/rope.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/vec.cuh"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// cosines and sines (seq, half): of (position_offset + t) * theta^(-2i/D); the sines negated
// when inverse.
__global__ void rope_angles_kernel(float* cosines, float* sines, RopeDims d) {
  const int64_t half = d.head_dim / 2, n = d.seq * half;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = k / half, i = k % half;
    // The angle in double, reduced to [-pi, pi] before the f32 sine and cosine: t * freq
    // reaches thousands of radians at long positions.
    const double a = double(d.position_offset + t) * rope_inv_freq(i, d.head_dim, d.theta);
    const float ar = float(a - 6.283185307179586 * rint(a / 6.283185307179586));
    float sn, cs;
    sincosf(ar, &sn, &cs);
    cosines[k] = cs;
    sines[k] = d.inverse ? -sn : sn;
  }
}

// Thread (j, row): item j of a row is head j / groups and its pairs [p, p + W), p = (j %
// groups) * W; a block covers blockDim.x items of blockDim.y rows and steps by the grid's
// rows. The index math is 32-bit and the item's head and pairs are found once per thread:
// 64-bit divisions per element cost more issue slots than the bytes take to move.
template <int W, typename T>
__global__ void rope_kernel(T* out, const T* x, const float* cosines, const float* sines,
                            RopeDims d) {
  const int half = int(d.head_dim / 2), groups = half / W, items = int(d.heads) * groups;
  const int j = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= items) return;
  const int h = j / groups, p = (j - h * groups) * W;
  const unsigned seq = unsigned(d.seq), rows = unsigned(d.batch * d.seq);
  for (unsigned row = blockIdx.y * blockDim.y + threadIdx.y; row < rows;
       row += gridDim.y * blockDim.y) {
    const unsigned b = row / seq, t = row - b * seq;
    const T* v = x + b * d.x.b + t * d.x.t + h * d.x.h;      // (D)
    T* o = out + b * d.out.b + t * d.out.t + h * d.out.h;    // (D)
    float x1[W], x2[W], cs[W], sn[W], y1[W], y2[W];
    load_floats<W>(v + p, x1);
    load_floats<W>(v + p + half, x2);
    load_floats<W>(cosines + int64_t(t) * half + p, cs);
    load_floats<W>(sines + int64_t(t) * half + p, sn);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      y1[i] = x1[i] * cs[i] - x2[i] * sn[i];
      y2[i] = x2[i] * cs[i] + x1[i] * sn[i];
    }
    store_floats<W>(o + p, y1);  // after both reads: in place is safe
    store_floats<W>(o + p + half, y2);
  }
}

int64_t angle_count(const RopeDims& d) { return d.seq * (d.head_dim / 2); }

}  // namespace

size_t rope_workspace_bytes(const RopeDims& d) {
  const size_t floats = (size_t(angle_count(d)) + 3) / 4 * 4;  // keeps the sines 16-byte aligned
  return 2 * floats * sizeof(float);
}

void rope(const RopeDims& d, void* out, const void* x, DType dtype, void* workspace,
          stream_t stream) {
  const int64_t angles = angle_count(d), rows = d.batch * d.seq;
  if (rows * d.heads * angles == 0) return;
  FSDP_CHECK(rows <= INT32_MAX && d.heads * (d.head_dim / 2) <= INT32_MAX, ShapeError,
             "rope: ", rows, " rows of ", d.heads, " heads of ", d.head_dim,
             " exceed the kernel's 32-bit indices");
  float* cosines = static_cast<float*>(workspace);
  float* sines = cosines + (angles + 3) / 4 * 4;
  rope_angles_kernel<<<grid_for(angles, kThreads), kThreads, 0, stream>>>(cosines, sines, d);
  FSDP_CHECK_LAUNCH();
  dispatch_compute(dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    // Whole packs of pairs when the half-head and every stride are multiples of a pack (so
    // each pack starts 16-byte aligned, as the pointers do): a pack being a power of two,
    // they all are when their bitwise or is.
    const int64_t half = d.head_dim / 2;
    const int64_t strides = d.x.b | d.x.t | d.x.h | d.out.b | d.out.t | d.out.h | half;
    dispatch_width<T>(strides, {out, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      // Threads along a row's items (a warp's loads cover whole heads), the rest of the
      // block's 256 along rows.
      const int64_t items = d.heads * (half / W);
      const int bx = int(std::min<int64_t>((items + 31) / 32 * 32, kThreads)), by = kThreads / bx;
      const dim3 grid(unsigned((items + bx - 1) / bx),
                      unsigned(std::min<int64_t>((rows + by - 1) / by, 65535)));
      rope_kernel<W, T><<<grid, dim3(bx, by), 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(x), cosines, sines, d);
      FSDP_CHECK_LAUNCH();
    });
  });
}

}  // namespace fsdp::kernels::cuda
