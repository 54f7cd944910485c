// Deterministic reduction on the host, the arithmetic of the MPI (CPU) backend.
//
// MPI has no bf16 or f16 and its own reductions may combine ranks in any order, so the
// CPU backend moves bytes with MPI and reduces here, always in rank order: the result is
// bitwise the same on every rank and in every run, and it is the reference the sharded
// CPU runs are compared against.
//
// Accumulation: f32 in f32, f64 in f64, bf16 and f16 in f32 (rounded once at the end),
// integers in 64 bits (wrapping). `prescale` multiplies each input, in the accumulation
// type, before it is added; Avg divides the sum by the number of ranks at the end
// (integer division, truncating, for integer types).
#pragma once

#include <cstddef>

#include "collectives/communicator.h"
#include "runtime/core/dtype.h"

namespace fsdp {

// `blocks` holds `nranks` inputs of `count` elements each, rank 0's first. Writes the
// reduction of element i over all ranks to out[i]. `out` must not overlap `blocks`.
void reduce_in_rank_order(const void* blocks, int nranks, size_t count, DType dtype,
                          ReduceOp op, double prescale, void* out);

}  // namespace fsdp
