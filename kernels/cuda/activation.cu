// GELU (tanh form) and SwiGLU on CUDA : elementwise, W elements
// per thread through 128-bit loads where the data allows, f32 math.
#include "kernels/cuda/activation.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <int W, typename T>
__global__ void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    float v[W], y[W];
    load_floats<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) y[j] = gelu_tanh(v[j]);
    store_floats<W>(out + i, y);
  }
}

template <int W, typename T>
__global__ void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    float v[W], g[W], d[W];
    load_floats<W>(x + i, v);
    load_floats<W>(dout + i, g);
#pragma unroll
    for (int j = 0; j < W; ++j) d[j] = g[j] * gelu_tanh_grad(v[j]);
    store_floats<W>(dx + i, d);
  }
}

// x (rows, 2F) = [gate | up], out (rows, F); element i of out is (row, f) = (i / F, i % F).
template <int W, typename T>
__global__ void swiglu_forward_kernel(T* out, const T* x, int64_t rows, int64_t F) {
  const int64_t n = rows * F;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    const int64_t r = i / F, f = i % F;
    float g[W], u[W], y[W];
    load_floats<W>(x + r * 2 * F + f, g);
    load_floats<W>(x + r * 2 * F + F + f, u);
#pragma unroll
    for (int j = 0; j < W; ++j) y[j] = silu(g[j]) * u[j];
    store_floats<W>(out + i, y);
  }
}

template <int W, typename T>
__global__ void swiglu_backward_kernel(T* dx, const T* dout, const T* x, int64_t rows, int64_t F) {
  const int64_t n = rows * F;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    const int64_t r = i / F, f = i % F;
    float g[W], u[W], d[W], dg[W], du[W];
    load_floats<W>(x + r * 2 * F + f, g);
    load_floats<W>(x + r * 2 * F + F + f, u);
    load_floats<W>(dout + i, d);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      dg[j] = d[j] * u[j] * silu_grad(g[j]);
      du[j] = d[j] * silu(g[j]);
    }
    store_floats<W>(dx + r * 2 * F + f, dg);
    store_floats<W>(dx + r * 2 * F + F + f, du);
  }
}

unsigned blocks_for(int64_t n, int w) { return grid_for((n + w - 1) / w, kThreads); }

}  // namespace

void gelu_forward(void* out, const void* x, int64_t n, DType dtype, stream_t stream) {
  if (n == 0) return;
  dispatch_compute(dtype, "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {out, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      gelu_forward_kernel<W, T><<<blocks_for(n, W), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(x), n);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, DType dtype,
                   stream_t stream) {
  if (n == 0) return;
  dispatch_compute(dtype, "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {dx, dout, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      gelu_backward_kernel<W, T><<<blocks_for(n, W), kThreads, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dout), static_cast<const T*>(x), n);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void swiglu_forward(void* out, const void* x, int64_t rows, int64_t features, DType dtype,
                    stream_t stream) {
  if (rows * features == 0) return;
  dispatch_compute(dtype, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(features, {out, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      swiglu_forward_kernel<W, T><<<blocks_for(rows * features, W), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(x), rows, features);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void swiglu_backward(void* dx, const void* dout, const void* x, int64_t rows, int64_t features,
                     DType dtype, stream_t stream) {
  if (rows * features == 0) return;
  dispatch_compute(dtype, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(features, {dx, dout, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      swiglu_backward_kernel<W, T><<<blocks_for(rows * features, W), kThreads, 0, stream>>>(
          static_cast<T*>(dx), static_cast<const T*>(dout), static_cast<const T*>(x), rows,
          features);
      FSDP_CHECK_LAUNCH();
    });
  });
}

}  // namespace fsdp::kernels::cuda
