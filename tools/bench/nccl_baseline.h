// The raw-NCCL baseline of `bench collectives`: NCCL's own calls on the communicator and
// stream our wrapper uses, with nothing around them (no checks, events or watchdog).
// CUDA builds only; implemented in nccl_baseline.cu (compiled by nvcc, which alone sees
// nccl.h's CUDA headers; see collectives/nccl_check.h).
#pragma once

#include <cstddef>

#include "collectives/nccl_communicator.h"
#include "runtime/core/dtype.h"

struct CUstream_st;

namespace fsdp::bench {

void raw_nccl_all_gather(ncclComm_t comm, const void* send, void* recv, size_t count_per_rank,
                         DType dtype, CUstream_st* stream);
void raw_nccl_reduce_scatter(ncclComm_t comm, const void* send, void* recv,
                             size_t count_per_rank, DType dtype, CUstream_st* stream);
void raw_nccl_all_reduce(ncclComm_t comm, const void* send, void* recv, size_t count,
                         DType dtype, CUstream_st* stream);

}  // namespace fsdp::bench
