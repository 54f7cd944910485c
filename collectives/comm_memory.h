// Memory for buffers that collectives register (Communicator::register_buffer; see
// BufferRegistration in communicator.h for what NCCL requires of it).
//
// On a GPU: ncclMemAlloc (cuMem / VMM memory, accessible to every peer GPU), outside the
// caching allocator, freed by ncclMemFree when the last tensor viewing it goes. On the CPU
// (the MPI backend registers nothing): ordinary host memory from the context, of the same
// size, so that memory reports are the same on both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/context.h"

namespace fsdp {

// ncclMemAlloc rounds each allocation up to the device's recommended cuMem granularity,
// 2 MiB on the GPUs we run on (H100/H200); memory predictions assume it.
constexpr size_t kRegistrableGranularity = size_t(2) << 20;

// What a registrable buffer of `bytes` costs (a buffer of 0 bytes takes one granule).
size_t registrable_bytes(size_t bytes);

// `numel` elements of `dtype`, zeroed, on ctx's device (a buffer of at least one element).
// `what` names the buffer in errors (e.g. an OutOfMemoryError).
Tensor zeros_registrable(Context& ctx, int64_t numel, DType dtype, const std::string& what);

}  // namespace fsdp
