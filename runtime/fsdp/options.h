// The options of fully_shard() and the plain records a sharded model reports (memory per
// buffer class, collective times). Nothing here allocates or communicates, so the dry run's
// memory estimate reads these without the sharded model itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "runtime/core/dtype.h"
#include "runtime/fsdp/plan.h"

namespace fsdp {

// What a unit of sharding is made of (the model's modules of that kind, in forward order).
enum class UnitKind : uint8_t {
  block,  // a transformer block
};
// The module kind of a unit kind ("block"), as models name their modules' kinds.
const char* unit_module_kind(UnitKind kind);
// Accepts "block"; throws ConfigError naming the value otherwise.
UnitKind unit_kind_from_name(const std::string& name);

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  DType compute_dtype = DType::f32;  // the weights ops read (bf16 on GPU)
  DType main_dtype = DType::f32;     // master weights the optimizer updates
  DType grad_dtype = DType::f32;     // what backward accumulates into
  DType reduce_dtype = DType::f32;   // reductions and the persistent gradient accumulation
  // Divide by the data-parallel size inside the collective (Avg) rather than pre-multiplying
  // the inputs by 1/dp.
  bool average_in_collective = false;
  int prefetch_units = 1;                          // all-gathers issued ahead of use
  int64_t max_inflight_reduce_bytes = 256 << 20;  // full-gradient buffers awaiting reduction
  UnitKind unit_kind = UnitKind::block;
  // Consecutive blocks per unit: a unit's weights are gathered and its gradients reduced as
  // one collective each (the bucket), so more blocks per unit means fewer, larger messages
  // and more memory held gathered.
  int blocks_per_unit = 1;
  int64_t shard_block = 4096;  // shard granularity in elements (see plan.h)
  uint64_t seed = 1234;        // parameter initialization
  // Side streams (CUDA) for all-gathers and for reductions; false: that kind of collective
  // runs on the compute stream, in order with compute.
  bool overlap_gather = true;
  bool overlap_reduce = true;
  // Benchmarks only: replace every collective by a local copy of the same buffers, so a
  // run times compute and optimizer alone (the results are then not those of training).
  bool skip_collectives = false;
  // CPU offload (optimizer.cpu_offload; CUDA): the master weights live in page-locked host
  // memory, so the optimizer (given host ranges) updates them on the host; the device keeps
  // the compute weights and gradients only.
  bool offload_main = false;
  // Benchmarks: time every collective of the step with CUDA events on its stream (from the
  // moment its stream reaches it until it ends: waiting for the peers included).
  bool time_collectives = false;
  // ZeRO-3: the blocks' weights this codec takes travel in its wire format, in an encoded
  // unit beside each block's unit (gather_codec.h). A codec serves one sharded model.
  // Null: none.
  std::shared_ptr<GatherCodec> gather_codec;
  // NCCL user-buffer registration (ddp.nccl_ub). With a shard group of more than one rank,
  // every buffer the shard group's collectives read or write is allocated registrable
  // (collectives/comm_memory.h: ncclMemAlloc on a GPU, outside the caching allocator) and
  // registered with its communicator as `nccl_ub_kind`: the compute weights, the gathered
  // weights (pool slots and the root's buffer) with the gather communicator; the full
  // gradients (pool slots, the root's buffer; ZeRO-1's accumulation and shard) and a
  // persistent reduce-scatter output (plus an input of the reduce dtype when gradients are
  // cast first) with the reduce communicator. Reduce-scatters then sum in the collective and
  // apply 1/dp in the accumulation that follows, since NCCL's symmetric kernels take no
  // pre-multiplied sum (same values; bitwise the same when dp is a power of two). Where the
  // backend registers nothing (MPI) the same buffers and schedule run unregistered.
  bool nccl_ub = false;
  BufferRegistration nccl_ub_kind = BufferRegistration::symmetric;
};

// Bytes per buffer class on this rank (see memory_report()).
struct MemoryBreakdown {
  size_t compute_weights = 0;   // persistent compute weights (shards, or full copies)
  size_t main_weights = 0;
  size_t grad_accumulation = 0; // persistent gradients (shards, or full copies)
  size_t full_grads = 0;        // persistent full-size gradient buffers (no_shard, optim)
  size_t gather_pool = 0;       // gathered-weight slots + the root's gathered buffer
  size_t grad_pool = 0;         // full-gradient slots awaiting reduction
  size_t host_main_weights = 0; // master weights in host memory (offload_main; not in total())
  size_t total() const {
    return compute_weights + main_weights + grad_accumulation + full_grads + gather_pool +
           grad_pool;
  }
};

}  // namespace fsdp
