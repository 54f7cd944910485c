// Token and position embeddings on CUDA.
//
// The token-embedding gradient is a scatter-add that must not depend on thread timing, so
// it never adds floats atomically. Instead: (1) count each token id's occurrences and scan
// the counts into bucket offsets, (2) sort the positions by token id with a stable radix
// sort (CUB), so each id's positions sit in ascending order at its offset, (3) one block per
// token id sums its gradient rows: eight lanes each add every eighth row in order, then the
// lanes are added in order. Same inputs, same bits, and a frequent token's thousands of rows
// are summed eight ways in parallel.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
// accumulate_rows_kernel's block: 32 threads across a tile of 32 packs of columns, times
// kRowLanes lanes over the token's rows.
constexpr int kRowLanes = 8;

// The table holds rows [begin, begin + V) (a vocabulary-parallel shard; begin 0 and every
// id for a whole table): another shard's id gives a zero row.
template <int W, typename T, typename O>
__global__ void embedding_forward_kernel(O* out, const int32_t* idx, const T* wte, const T* wpe,
                                         int64_t tokens, int64_t seq, int64_t C, int64_t begin,
                                         int64_t V) {
  const int64_t chunks = C / W;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens * chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = i / chunks, c = (i % chunks) * W;
    const int64_t row = int64_t(idx[bt]) - begin;
    float e[W] = {}, p[W] = {};
    if (row >= 0 && row < V) load_floats<W>(wte + row * C + c, e);
    if (wpe) load_floats<W>(wpe + (bt % seq) * C + c, p);
#pragma unroll
    for (int j = 0; j < W; ++j) e[j] += p[j];
    store_floats<W>(out + bt * C + c, e);
  }
}

// A shard's bucket keys: id - begin for the ids it holds, V (one bucket past its rows,
// never accumulated) for the others.
__global__ void shard_keys_kernel(int32_t* keys, const int32_t* idx, int64_t tokens,
                                  int64_t begin, int64_t V) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = int64_t(idx[i]) - begin;
    keys[i] = int32_t(row >= 0 && row < V ? row : V);
  }
}

__global__ void count_tokens_kernel(const int32_t* idx, int64_t tokens, int32_t* counts) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[idx[i]], 1);
}

// offsets[v] = sum of counts[0..v) (and offsets[V] = total). One block:
// each thread scans a contiguous segment, then the segment totals are scanned.
__global__ void scan_counts_kernel(const int32_t* counts, int64_t V, int32_t* offsets) {
  __shared__ int32_t totals[kScanThreads];
  const int64_t seg = (V + kScanThreads - 1) / kScanThreads;
  const int64_t v0 = threadIdx.x * seg, v1 = min(V, v0 + seg);
  int32_t local = 0;
  for (int64_t v = v0; v < v1; ++v) local += counts[v];
  totals[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int t = 0; t < kScanThreads; ++t) {
      const int32_t c = totals[t];
      totals[t] = run;
      run += c;
    }
    offsets[V] = run;
  }
  __syncthreads();
  int32_t run = totals[threadIdx.x];
  for (int64_t v = v0; v < v1; ++v) {
    offsets[v] = run;
    run += counts[v];
  }
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = int32_t(i);
}

// One block per token id v: dwte[v] += the dout rows of its positions (sorted[offsets[v] ..
// offsets[v + 1]), ascending). Thread (x, y) owns W columns of each 32 W-column tile and
// adds rows y, y + 8, ... in order; the 8 lane sums are then added in lane order.
template <int W, typename T, typename G>
__global__ void accumulate_rows_kernel(G* dwte, const T* dout, const int32_t* offsets,
                                       const int32_t* sorted, int64_t C) {
  __shared__ float lanes[kRowLanes][kWarp * W];
  const int64_t v = blockIdx.x;
  const int32_t begin = offsets[v], end = offsets[v + 1];
  if (begin == end) return;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t tile = 0; tile < C; tile += int64_t(kWarp) * W) {
    const int64_t c = tile + int64_t(tx) * W;
    float acc[W] = {};
    if (c < C) {
      for (int32_t e = begin + ty; e < end; e += kRowLanes) {
        float g[W];
        load_floats<W>(dout + int64_t(sorted[e]) * C + c, g);
#pragma unroll
        for (int j = 0; j < W; ++j) acc[j] += g[j];
      }
    }
#pragma unroll
    for (int j = 0; j < W; ++j) lanes[ty][tx * W + j] = acc[j];
    __syncthreads();
    if (ty == 0 && c < C) {
#pragma unroll
      for (int j = 0; j < W; ++j) {
        float total = 0;
        for (int l = 0; l < kRowLanes; ++l) total += lanes[l][tx * W + j];  // fixed order
        G& d = dwte[v * C + c + j];
        d = from_float<G>(to_float(d) + total);
      }
    }
    __syncthreads();
  }
}

// Workspace: counts (V + 1: the last bucket holds the ids a shard does not), offsets (V + 2),
// keys (N), positions (N), sorted ids (N), sorted positions (N) as int32, then the
// position-embedding partial sums (f32), then CUB's sort scratch.
struct EmbeddingScratch {
  int32_t *counts, *offsets, *keys, *positions, *sorted_ids, *sorted;
  float* partials;
  void* sort_temp;
  size_t sort_temp_bytes;
};

size_t index_ints(const EmbeddingDims& d) { return size_t(2 * d.vocab + 3 + 4 * d.batch * d.seq); }
// Buckets: one per row, and one for the ids a shard does not hold.
int64_t buckets(const EmbeddingDims& d) { return d.vocab + 1; }

// Bits of the largest token id: the radix sort looks at no others.
int id_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) < vocab) ++bits;
  return bits;
}

size_t sort_temp_bytes(const EmbeddingDims& d) {
  size_t bytes = 0;
  const int64_t n = d.batch * d.seq;
  FSDP_CALL(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr),
                                            static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), n, 0,
                                            id_bits(buckets(d))));
  return bytes;
}

size_t partial_floats(const EmbeddingDims& d) {
  return column_sum_workspace_bytes(d.batch, d.seq * d.channels) / sizeof(float);
}

EmbeddingScratch carve(const EmbeddingDims& d, void* workspace) {
  EmbeddingScratch s;
  const int64_t n = d.batch * d.seq;
  s.counts = static_cast<int32_t*>(workspace);
  s.offsets = s.counts + buckets(d);
  s.keys = s.offsets + buckets(d) + 1;
  s.positions = s.keys + n;
  s.sorted_ids = s.positions + n;
  s.sorted = s.sorted_ids + n;
  const size_t ints = (index_ints(d) + 3) / 4 * 4;  // keep the floats 16-byte aligned
  s.partials = reinterpret_cast<float*>(static_cast<int32_t*>(workspace) + ints);
  // CUB's scratch starts at a 256-byte boundary (the workspace holds 256 spare bytes).
  const uintptr_t after = reinterpret_cast<uintptr_t>(s.partials + (partial_floats(d) + 3) / 4 * 4);
  s.sort_temp = reinterpret_cast<void*>((after + 255) / 256 * 256);
  s.sort_temp_bytes = sort_temp_bytes(d);
  return s;
}

}  // namespace

void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe, stream_t stream) {
  const int64_t tokens = d.batch * d.seq;
  if (tokens == 0 || d.channels == 0) return;
  dispatch_compute(d.dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_residual<T>(d.out_dtype, "embedding_forward", [&](auto otag) {
      using O = decltype(otag);
      dispatch_width<T>(d.channels, {out, wte, wpe}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        embedding_forward_kernel<W, T, O>
            <<<grid_for(tokens * d.channels / W, kThreads), kThreads, 0, stream>>>(
                static_cast<O*>(out), idx, static_cast<const T*>(wte),
                static_cast<const T*>(wpe), tokens, d.seq, d.channels, d.vocab_begin, d.vocab);
        FSDP_CHECK_LAUNCH();
      });
    });
  });
}

size_t embedding_backward_workspace_bytes(const EmbeddingDims& d) {
  const size_t ints = (index_ints(d) + 3) / 4 * 4;
  const size_t floats = (partial_floats(d) + 3) / 4 * 4;
  return ints * sizeof(int32_t) + floats * sizeof(float) + 256 + sort_temp_bytes(d);
}

void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx, void* workspace, stream_t stream) {
  const int64_t tokens = d.batch * d.seq;
  if (tokens == 0 || d.channels == 0) return;
  const EmbeddingScratch s = carve(d, workspace);
  if (dwte) {
    // A whole table's ids are its bucket keys; a shard's are mapped first.
    const int32_t* keys = idx;
    if (d.vocab_begin != 0 || d.vocab_total != d.vocab) {
      shard_keys_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(
          s.keys, idx, tokens, d.vocab_begin, d.vocab);
      FSDP_CHECK_LAUNCH();
      keys = s.keys;
    }
    FSDP_CALL(cudaMemsetAsync(s.counts, 0, size_t(buckets(d)) * sizeof(int32_t), stream));
    count_tokens_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(keys, tokens, s.counts);
    FSDP_CHECK_LAUNCH();
    scan_counts_kernel<<<1, kScanThreads, 0, stream>>>(s.counts, buckets(d), s.offsets);
    FSDP_CHECK_LAUNCH();
    // Positions sorted by token id; stable, so ascending within each id.
    iota_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(s.positions, tokens);
    FSDP_CHECK_LAUNCH();
    size_t temp_bytes = s.sort_temp_bytes;
    FSDP_CALL(cub::DeviceRadixSort::SortPairs(s.sort_temp, temp_bytes, keys, s.sorted_ids,
                                              s.positions, s.sorted, tokens, 0,
                                              id_bits(buckets(d)), stream));
    dispatch_compute(d.dtype, "embedding_backward", [&](auto ttag) {
      using T = decltype(ttag);
      dispatch_compute(d.grad_dtype, "embedding_backward gradient", [&](auto gtag) {
        using G = decltype(gtag);
        dispatch_width<T>(d.channels, {dout}, [&](auto w) {
          constexpr int W = decltype(w)::value;
          accumulate_rows_kernel<W, T, G><<<unsigned(d.vocab), dim3(kWarp, kRowLanes), 0, stream>>>(
              static_cast<G*>(dwte), static_cast<const T*>(dout), s.offsets, s.sorted,
              d.channels);
          FSDP_CHECK_LAUNCH();
        });
      });
    });
  }
  if (dwpe) {  // dwpe[t] += sum over b of dout[b, t]: column sums of dout viewed as (B, T*C)
    const int64_t n = d.seq * d.channels;
    column_partials(dout, d.dtype, d.batch, n, s.partials, stream);
    finish_column_sums(s.partials, column_row_blocks(d.batch), n, dwpe, d.grad_dtype, true, stream);
  }
}

}  // namespace fsdp::kernels::cuda
