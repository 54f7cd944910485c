// The 8 x 8 block of FP8 bytes one thread of the register cast (kernels/cuda/fp8.cu,
// `quantize_regs_kernel`) converts and writes in both layouts without shared memory: 8 rows
// of 8 consecutive columns, each row one 64-bit word (byte j = column j), turned into the 8
// columns as 64-bit words (byte i = row i) by byte permutes in registers.
#pragma once

#include <cstdint>

#include "kernels/cuda/fp8_encode.cuh"

namespace fsdp::kernels::cuda::fp8_block8 {

// The 8 values of a row, scaled, as one word of bytes (byte j = fp8(v[j] * scale)).
__device__ __forceinline__ uint2 encode_row(const float (&v)[8], float scale, Fp8Format f) {
  uint32_t p[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    p[j] = fp8_encode2_satfinite(__fmul_rn(v[2 * j], scale), __fmul_rn(v[2 * j + 1], scale), f);
  return make_uint2(p[0] | p[1] << 16, p[2] | p[3] << 16);
}

// Half h (0: bytes 0-3, 1: bytes 4-7) of a word.
__device__ __forceinline__ uint32_t half(const uint2& w, int h) { return h == 0 ? w.x : w.y; }

// cols[j] = the bytes j of rows[0..7] (byte i of cols[j] = byte j of rows[i]).
__device__ __forceinline__ void transpose(const uint2 (&rows)[8], uint2 (&cols)[8]) {
#pragma unroll
  for (int j = 0; j < 8; j += 2) {  // columns j and j + 1, in half h of each row
    const int h = j / 4, k = j % 4;
    // [r_a.k, r_b.k, r_a.k+1, r_b.k+1] of two rows' halves.
    const uint32_t sel = uint32_t(k) | uint32_t(k + 4) << 4 | uint32_t(k + 1) << 8 | uint32_t(k + 5) << 12;
    const uint32_t a = __byte_perm(half(rows[0], h), half(rows[1], h), sel);
    const uint32_t b = __byte_perm(half(rows[2], h), half(rows[3], h), sel);
    const uint32_t c = __byte_perm(half(rows[4], h), half(rows[5], h), sel);
    const uint32_t d = __byte_perm(half(rows[6], h), half(rows[7], h), sel);
    cols[j] = make_uint2(__byte_perm(a, b, 0x5410), __byte_perm(c, d, 0x5410));
    cols[j + 1] = make_uint2(__byte_perm(a, b, 0x7632), __byte_perm(c, d, 0x7632));
  }
}

// An (8, 8) block of bytes at (r, c) of a (rows, q_cols) matrix, in both layouts: its rows
// into q (row-major, q_cols bytes a row) and its columns into qt (the transpose, rows bytes
// a row); either may be null. Whole blocks only, q and qt 8-byte aligned.
__device__ __forceinline__ void store_both(const uint2 (&b)[8], uint8_t* q, int64_t q_cols,
                                           uint8_t* qt, int64_t rows, int64_t r, int64_t c) {
  if (q) {
#pragma unroll
    for (int i = 0; i < 8; ++i) *reinterpret_cast<uint2*>(q + (r + i) * q_cols + c) = b[i];
  }
  if (qt) {
    uint2 t[8];  // column j of the block: byte i = row r + i
    transpose(b, t);
#pragma unroll
    for (int j = 0; j < 8; ++j) *reinterpret_cast<uint2*>(qt + (c + j) * rows + r) = t[j];
  }
}

}  // namespace fsdp::kernels::cuda::fp8_block8
