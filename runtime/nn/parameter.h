// Parameter: one trainable tensor of a model, first as a spec (name, shape, init rule), then
// materialized (data and grad tensors on a device).
//
// `data` holds the compute weights that ops read; `grad` is where backward ACCUMULATES the
// parameter's gradient. Both are plain Tensors that their owner may replace at any time
// between ops: FSDP points `data` at views into its gathered unit buffers and `grad` at views
// into its gradient buffers. Backward functions therefore read `data` and `grad` when they
// run, never a copy taken during forward.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/fp8_recipe.h"
#include "runtime/nn/parallel_slice.h"
#include "runtime/nn/placement.h"

namespace fsdp::nn {

class ParallelGroup;

// How a parameter's elements are initialized. Random rules draw element i from the
// counter-based generator keyed by (seed, hash of the parameter's full name, i).
struct InitRule {
  enum class Kind : uint8_t { Normal, Uniform, Zeros, Ones };
  Kind kind = Kind::Zeros;
  double a = 0;  // Normal: mean; Uniform: low
  double b = 0;  // Normal: std;  Uniform: high

  static InitRule normal(double mean, double std) { return {Kind::Normal, mean, std}; }
  static InitRule uniform(double low, double high) { return {Kind::Uniform, low, high}; }
  static InitRule zeros() { return {Kind::Zeros, 0, 0}; }
  static InitRule ones() { return {Kind::Ones, 0, 0}; }
  std::string str() const;  // "normal(0, 0.02)"
};

// A weight whose linear layer runs its three products (forward, input and weight gradients)
// in FP8, and the FP8 forms of it the layer reads.
struct Fp8Weight {
  Fp8Recipe recipe;  // how, where the shapes fit FP8 tensor cores
  // The weight as gathered in FP8 (FSDP's FP8 gather codec, mixed_precision.fp8_param), in
  // place of Parameter::data (then undefined): bytes (out, in) u8 in the recipe's forward
  // format and scale_inv (1) f32. The layer reads them instead of quantizing the weight.
  Tensor bytes, scale_inv;
  bool gathered() const { return bytes.defined(); }
  // Under recipe.cache_weight, the weight's casts for the forward (rows) and the input
  // gradient (columns), made by its first product after an update and read by the rest;
  // cleared whenever new weights are written (and at each step's start, so that the step's
  // first cast records the weight's amax under delayed scaling). (mutable: a cache of the
  // weight's value, filled by products that read the weight.)
  mutable std::optional<ops::Fp8Quantized> cast;
};

class Parameter {
 public:
  // A spec: no memory yet. `weight_decay` says whether AdamW decays it (2-D weights and
  // embeddings: yes; biases and norm gains: no).
  Parameter(std::string local_name, Shape shape, InitRule init, bool weight_decay);

  // Full dotted name within the model ("h.3.attn.qkv.weight"); set when the owning module
  // is registered under its parent.
  const std::string& name() const { return name_; }
  const std::string& local_name() const { return local_name_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  const InitRule& init() const { return init_; }
  bool weight_decay() const { return weight_decay_; }

  // The compute weights (undefined until materialized or installed by FSDP).
  Tensor data;
  // The gradient accumulation target (undefined until the first gradient arrives, or until
  // FSDP installs its views). Backward adds into it; only its owner zeroes it.
  Tensor grad;

  // The dtype of the gradient that backward allocates when `grad` is undefined. Unless set,
  // f32 for 16-bit data (bf16/f16) and the data's own dtype otherwise.
  DType grad_dtype() const;
  void set_grad_dtype(DType dtype) { grad_dtype_ = dtype; }

  // The gradient buffer backward accumulates into: `grad`, allocated zeroed (shape of the
  // spec, grad_dtype(), on ctx's device) if undefined.
  Tensor& grad_for_accumulation(Context& ctx);
  // Zeroes `grad` in place if defined (for owners of dense gradients).
  void zero_grad(Context& ctx);

  // Checks that `data` is materialized with the spec's shape; throws ValueError naming the
  // parameter otherwise.
  const Tensor& checked_data() const;

  // ---- placement (set by the plans from outside the model, on specs only)
  // How the parameter lies over the model-parallel ranks. With a slice, this rank holds that
  // part of the full parameter: shape() becomes the local shape; the name, the init rule and
  // full_shape() stay those of the full parameter, so every local element initializes to,
  // and is saved as, its element of the full tensor. A slice, once set, stays.
  const Placement& placement() const { return placement_; }
  void set_placement(Placement placement);
  // Shorthands: the slice, and a placement with only `slice` changed.
  const std::optional<ParallelSlice>& parallel_slice() const { return placement_.slice; }
  void set_parallel_slice(ParallelSlice slice);
  const Shape& full_shape() const { return placement_.slice ? placement_.slice->full_shape : shape_; }
  // ---- FP8 (set by a plan from outside the model)
  // The linear layer that owns this weight runs its products in FP8 (Fp8Weight).
  std::optional<Fp8Weight> fp8;

 private:
  friend class Module;
  std::string local_name_;
  std::string name_;
  Shape shape_;
  InitRule init_;
  bool weight_decay_;
  std::optional<DType> grad_dtype_;
  Placement placement_;
};

}  // namespace fsdp::nn
