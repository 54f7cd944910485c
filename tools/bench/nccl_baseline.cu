// Compiled by nvcc (host code only): see nccl_baseline.h.
#include "tools/bench/nccl_baseline.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "collectives/nccl_check.h"
#include "collectives/nccl_types.h"

namespace fsdp::bench {

void raw_nccl_all_gather(ncclComm_t comm, const void* send, void* recv, size_t count_per_rank,
                         DType dtype, CUstream_st* stream) {
  const NcclBuffer b = nccl_movement(dtype, count_per_rank);
  FSDP_CALL(ncclAllGather(send, recv, b.count, b.type, comm, stream));
}

void raw_nccl_reduce_scatter(ncclComm_t comm, const void* send, void* recv,
                             size_t count_per_rank, DType dtype, CUstream_st* stream) {
  FSDP_CALL(ncclReduceScatter(send, recv, count_per_rank, nccl_data_type(dtype), ncclSum, comm,
                              stream));
}

void raw_nccl_all_reduce(ncclComm_t comm, const void* send, void* recv, size_t count,
                         DType dtype, CUstream_st* stream) {
  FSDP_CALL(ncclAllReduce(send, recv, count, nccl_data_type(dtype), ncclSum, comm, stream));
}

}  // namespace fsdp::bench
