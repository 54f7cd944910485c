// NCCL's names for our element types and reductions. Included only by nvcc-compiled files
// (see nccl_check.h).
#pragma once

#include <nccl.h>

#include "collectives/communicator.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace fsdp {

// NCCL's type for reducing `dtype` data. NCCL has no 16-bit integer: u16 data can only be
// moved (as twice as many u8), not reduced.
inline ncclDataType_t nccl_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f64: return ncclFloat64;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
    case DType::u8: return ncclUint8;
    case DType::u16: break;
  }
  FSDP_THROW(DTypeError, "NCCL has no type for ", dtype_name(dtype), " data to reduce");
}

// `count` elements of `dtype` as NCCL moves them (u16 as bytes).
struct NcclBuffer {
  size_t count;
  ncclDataType_t type;
};
inline NcclBuffer nccl_movement(DType dtype, size_t count) {
  if (dtype == DType::u16) return {count * 2, ncclUint8};
  return {count, nccl_data_type(dtype)};
}

inline ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace fsdp
