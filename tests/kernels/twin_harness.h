// The CPU-vs-CUDA twin harness: every CUDA kernel is run through the dispatch layer
// (kernels/ops.h) on a CPU context and on a CUDA context, and every output of the CUDA side
// is compared with the CPU reference's.
//
// A twin case is one function, run once per side. It builds its inputs through the side (the
// same values on both), calls the ops on side.ctx(), and records each output with the
// tolerance it must meet and why. The harness then compares the two sides output by output.
// Each kernel family registers its cases in tests/kernels/twins/FAMILY_twins.cc (FAMILY is
// the kernel file's name under kernels/cuda/), e.g.
//
//   void register_norm_twins() {
//     register_twin({"norm", "rmsnorm 33x72 f32", [](TwinSide& s) {
//       const Tensor x = s.random(Shape{33, 72}, DType::f32, 1);  // (N, C)
//       ...
//       s.output("out", out, Tolerance::scaled(1e-5, "f32 rounding and summation order"));
//     }});
//   }
//   FSDP_REGISTER_TWINS(register_norm_twins)
//
// Each registered case becomes two Catch2 test cases: "twin FAMILY: NAME" [gpu] (both sides,
// compared; skipped without a GPU) and "twin reference FAMILY: NAME" (the CPU side alone: it
// runs, its outputs are finite and its expectations hold; runs everywhere). Both are tagged
// [twin] and [FAMILY]. The [gpu] case prints one line per output: max abs error, max rel
// error, the error relative to the output's scale, the tolerance, and pass or FAIL.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::testing {

// How a CUDA output is compared with the CPU reference's, the bound it must stay below, and
// why that bound is right for this output.
struct Tolerance {
  enum class Measure {
    exact,        // every value equal, bit for bit
    absolute,     // max |cuda - cpu|
    scaled,       // max |cuda - cpu| / max |cpu|: the error relative to the output's scale
    elementwise,  // max |cuda - cpu| / max(|cpu|, 1e-6), element by element
    mismatched,   // the fraction of elements whose values differ at all
  };
  Measure measure = Measure::exact;
  double bound = 0;  // the measured value must be below it (exact: ignored)
  std::string reason;

  static Tolerance exact(std::string reason);
  static Tolerance absolute(double bound, std::string reason);
  static Tolerance scaled(double bound, std::string reason);
  static Tolerance elementwise(double bound, std::string reason);
  static Tolerance mismatched(double fraction, std::string reason);
};

// The differences between two equally long lists of values (CUDA's, then the reference's).
// A NaN on either side makes every measure infinite.
struct Errors {
  double max_abs = 0;
  double max_rel = 0;     // element by element, |cpu| floored at 1e-6
  double scaled = 0;      // max_abs / max |cpu|
  double mismatched = 0;  // fraction of elements not bitwise equal
};
Errors measure_errors(const std::vector<double>& cuda, const std::vector<double>& cpu);
double measured(const Errors& e, Tolerance::Measure m);
bool within(const Errors& e, const Tolerance& t);

// One output of one side: its values (copied to the host when recorded) and its tolerance.
struct TwinOutput {
  std::string name;
  std::vector<double> values;
  Tolerance tolerance;
};

// One side of a twin run: the CPU reference, or the CUDA device under test.
class TwinSide {
 public:
  TwinSide(Context& ctx, bool reference) : ctx_(ctx), reference_(reference) {}

  Context& ctx() const { return ctx_; }
  bool is_reference() const { return reference_; }
  // The dtype this side holds a `dt` tensor in: CUDA holds dt itself; the CPU reference
  // computes bf16 and f16 in f32 (its nn kernels run in f32 and f64 only), f32 and f64 as is.
  DType dtype(DType dt) const;

  // Inputs with the same values on both sides: drawn uniformly in [lo, hi) from `seed`,
  // rounded to dt once, and held in dtype(dt). The reference thus computes in f32 on exactly
  // the bf16 values CUDA sees, and a comparison measures only CUDA's arithmetic and rounding.
  Tensor random(const Shape& shape, DType dt, uint32_t seed, double lo = -1, double hi = 1) const;
  Tensor full(const Shape& shape, DType dt, double value) const;
  Tensor empty(const Shape& shape, DType dt) const;
  // As random(), but held in dt on both sides: for the basic ops, which the CPU runs in
  // every dtype.
  Tensor random_native(const Shape& shape, DType dt, uint32_t seed, double lo = -1,
                       double hi = 1) const;
  // int32 indices (token ids, targets) on this side.
  Tensor indices(const std::vector<int32_t>& ids, const Shape& shape) const;
  // t as a `dt` tensor stores it (rounded to dt), held in dtype(dt): the reference's f32
  // value rounded the way CUDA's bf16 tensor rounded it.
  Tensor rounded(const Tensor& t, DType dt) const;
  // Every value of t, on the host, in logical order.
  std::vector<double> values(const Tensor& t) const;

  // Records an output, compared with the other side's output of the same name.
  void output(const std::string& name, const Tensor& t, const Tolerance& tolerance);
  // Records a property this side must have by itself (determinism, a fused kernel's bits
  // equal to the unfused ones, ignored rows left at zero), checked on both sides unless the
  // case asks only one side.
  void expect(bool holds, const std::string& what);

  const std::vector<TwinOutput>& outputs() const { return outputs_; }
  const std::vector<std::string>& broken_expectations() const { return broken_; }
  int64_t expectations() const { return expectations_; }

 private:
  // A host tensor in its own dtype, moved to this side and held in dtype() of it.
  Tensor place(const Tensor& host_in_dt) const;

  Context& ctx_;
  bool reference_;
  mutable Context host_;  // draws inputs on the host, the same way for both sides
  std::vector<TwinOutput> outputs_;
  std::vector<std::string> broken_;
  int64_t expectations_ = 0;
};

// A twin case: a kernel family (the kernel file under kernels/cuda/), the op and its
// shape/dtype variant, and the function that runs it on one side.
struct TwinCase {
  std::string family;
  std::string name;
  std::function<void(TwinSide&)> run;
};

// "4096x768" for Shape{4096, 768}: shapes in case names.
std::string shape_name(const Shape& shape);

// Adds a case to the registry and registers its two Catch2 test cases.
void register_twin(TwinCase twin);
// Every case registered so far, in registration order.
const std::vector<TwinCase>& twin_cases();

// The checks behind each case's two Catch2 test cases: both sides compared, with one report
// line per output (needs a GPU) ...
void check_twin_on_gpu(const TwinCase& twin);
// ... and the reference side alone: it runs, its outputs are finite, its expectations hold.
void check_twin_reference(const TwinCase& twin);

}  // namespace fsdp::testing

// Runs `fn` (a function registering one family's cases) once, at program start-up.
#define FSDP_REGISTER_TWINS(fn) \
  static const bool fn##_registered = (fn(), true);
