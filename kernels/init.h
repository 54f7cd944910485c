// Counter-based parameter initialization at the Tensor level (kernels/ops.h has the
// conventions): kernels/init.cc routes it to kernels/cpu/init.h or kernels/cuda/init.h.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// Counter-based, slice-invariant random init: element i of the parameter identified by
// (seed, key) is a function of (seed, key, i) alone, so initializing elements
// [offset, offset + out.numel()) of a parameter alone gives exactly the same values as the
// same slice of a full initialization. `key` is a hash of the parameter's name.
void init_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std);
void init_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high);
// Stable 64-bit hash of a parameter name (FNV-1a), the `key` above.
uint64_t name_key(const std::string& name);

}  // namespace fsdp::ops
