// Materializing a model built as specs, and initializing any slice of any parameter.
//
// Every random parameter element i is drawn from the counter-based generator keyed by
// (seed, ops::name_key(parameter's full name), i), so initializing elements
// [offset, offset + n) of a parameter on its own gives exactly the values of the same slice
// of a full initialization: FSDP initializes only its shards, and the result equals a
// single-process run's.
#pragma once

#include <cstdint>

#include "runtime/nn/module.h"

namespace fsdp::nn {

// Writes elements [offset, offset + out.numel()) of `param`'s row-major flattening, as its
// init rule gives them for `seed`, into `out` (contiguous, any floating dtype, on ctx's
// device). Throws IndexError if the range leaves the parameter. A tensor-parallel slice
// (Parameter::parallel_slice) is addressed by its local elements and initializes to their
// values in the full parameter.
void init_parameter_range(Context& ctx, const Parameter& param, uint64_t seed, int64_t offset,
                          const Tensor& out);

// Allocates every parameter of `model` densely on ctx's device in `dtype` (data only; grads
// stay undefined until backward) and initializes it from `seed`.
void materialize(Context& ctx, Module& model, DType dtype, uint64_t seed);

// Sets the gradient dtype of every parameter of `model` (see Parameter::grad_dtype).
void set_grad_dtype(Module& model, DType dtype);

// Zeroes every defined parameter gradient of `model`.
void zero_grad(Context& ctx, Module& model);

// Drops every parameter gradient of `model` (undefined again: the next backward allocates).
void release_grads(Module& model);

}  // namespace fsdp::nn
