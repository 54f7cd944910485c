#include "tests/kernels/twin_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

namespace fsdp::testing {

// ---------------------------------------------------------------- tolerances and errors

Tolerance Tolerance::exact(std::string reason) {
  return {Measure::exact, 0, std::move(reason)};
}
Tolerance Tolerance::absolute(double bound, std::string reason) {
  return {Measure::absolute, bound, std::move(reason)};
}
Tolerance Tolerance::scaled(double bound, std::string reason) {
  return {Measure::scaled, bound, std::move(reason)};
}
Tolerance Tolerance::elementwise(double bound, std::string reason) {
  return {Measure::elementwise, bound, std::move(reason)};
}
Tolerance Tolerance::mismatched(double fraction, std::string reason) {
  return {Measure::mismatched, fraction, std::move(reason)};
}

Errors measure_errors(const std::vector<double>& cuda, const std::vector<double>& cpu) {
  Errors e;
  if (cuda.size() != cpu.size()) return {INFINITY, INFINITY, INFINITY, 1.0};
  double scale = 0;
  int64_t differ = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double d = std::fabs(cuda[i] - cpu[i]);
    if (std::isnan(d)) return {INFINITY, INFINITY, INFINITY, 1.0};
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / std::max(std::fabs(cpu[i]), 1e-6));
    scale = std::max(scale, std::fabs(cpu[i]));
    differ += cuda[i] != cpu[i];
  }
  e.scaled = e.max_abs / std::max(scale, 1e-30);
  e.mismatched = cpu.empty() ? 0.0 : double(differ) / double(cpu.size());
  return e;
}

double measured(const Errors& e, Tolerance::Measure m) {
  switch (m) {
    case Tolerance::Measure::exact: return e.max_abs;
    case Tolerance::Measure::absolute: return e.max_abs;
    case Tolerance::Measure::scaled: return e.scaled;
    case Tolerance::Measure::elementwise: return e.max_rel;
    case Tolerance::Measure::mismatched: return e.mismatched;
  }
  return INFINITY;
}

bool within(const Errors& e, const Tolerance& t) {
  if (t.measure == Tolerance::Measure::exact) return e.max_abs == 0;
  return measured(e, t.measure) < t.bound;
}

namespace {

const char* measure_name(Tolerance::Measure m) {
  switch (m) {
    case Tolerance::Measure::exact: return "exact";
    case Tolerance::Measure::absolute: return "abs";
    case Tolerance::Measure::scaled: return "rel to scale";
    case Tolerance::Measure::elementwise: return "rel";
    case Tolerance::Measure::mismatched: return "mismatched";
  }
  return "?";
}

std::string describe(const Tolerance& t) {
  if (t.measure == Tolerance::Measure::exact) return "exact";
  char text[64];
  std::snprintf(text, sizeof(text), "%s < %.1e", measure_name(t.measure), t.bound);
  return text;
}

}  // namespace

// ---------------------------------------------------------------- one side

DType TwinSide::dtype(DType dt) const {
  if (!reference_) return dt;
  return dt == DType::bf16 || dt == DType::f16 ? DType::f32 : dt;
}

Tensor TwinSide::place(const Tensor& host_in_dt) const {
  // The reference side computes on the host tensor itself when it is of its dtype already.
  if (reference_ && dtype(host_in_dt.dtype()) == host_in_dt.dtype()) return host_in_dt;
  if (reference_) return ops::cast(ctx_, host_in_dt, dtype(host_in_dt.dtype()));
  return ops::to_device(ctx_, host_in_dt, ctx_.device());
}

Tensor TwinSide::random(const Shape& shape, DType dt, uint32_t seed, double lo, double hi) const {
  return place(random_tensor(host_, shape, dt, seed, lo, hi));
}

Tensor TwinSide::full(const Shape& shape, DType dt, double value) const {
  return place(ops::full(host_, shape, dt, value));
}

Tensor TwinSide::empty(const Shape& shape, DType dt) const {
  return ops::empty(ctx_, shape, dtype(dt));
}

Tensor TwinSide::random_native(const Shape& shape, DType dt, uint32_t seed, double lo,
                               double hi) const {
  return ops::to_device(ctx_, random_tensor(host_, shape, dt, seed, lo, hi), ctx_.device());
}

Tensor TwinSide::indices(const std::vector<int32_t>& ids, const Shape& shape) const {
  return ops::to_device(ctx_, ops::from_host<int32_t>(host_, ids, shape), ctx_.device());
}

Tensor TwinSide::rounded(const Tensor& t, DType dt) const {
  return ops::cast(ctx_, ops::cast(ctx_, t, dt), dtype(dt));
}

std::vector<double> TwinSide::values(const Tensor& t) const {
  return testing::values(ctx_, t);
}

void TwinSide::output(const std::string& name, const Tensor& t, const Tolerance& tolerance) {
  outputs_.push_back({name, values(t), tolerance});
}

void TwinSide::expect(bool holds, const std::string& what) {
  ++expectations_;
  if (!holds) broken_.push_back(what);
}

// ---------------------------------------------------------------- registry and checks

namespace {

std::vector<TwinCase>& registry() {
  static std::vector<TwinCase> cases;
  return cases;
}

// One Catch2 test case running one twin case, on the GPU against the CPU or on the CPU alone.
class TwinTest : public Catch::ITestInvoker {
 public:
  TwinTest(TwinCase twin, bool on_gpu) : twin_(std::move(twin)), on_gpu_(on_gpu) {}
  void invoke() const override {
    if (on_gpu_)
      check_twin_on_gpu(twin_);
    else
      check_twin_reference(twin_);
  }

 private:
  TwinCase twin_;
  bool on_gpu_;
};

void check_expectations(const TwinSide& side) {
  for (const std::string& what : side.broken_expectations()) {
    INFO((side.is_reference() ? "CPU" : "CUDA") << " side: " << what);
    CHECK(false);
  }
}

}  // namespace

std::string shape_name(const Shape& shape) {
  std::string name;
  for (int64_t d : shape.dims()) name += (name.empty() ? "" : "x") + std::to_string(d);
  return name;
}

void register_twin(TwinCase twin) {
  registry().push_back(twin);
  // Catch2 copies the name and tags; the strings need only outlive these calls.
  const std::string label = twin.family + ": " + twin.name;
  const std::string gpu_name = "twin " + label, cpu_name = "twin reference " + label;
  const std::string gpu_tags = "[kernels][twin][gpu][" + twin.family + "]";
  const std::string cpu_tags = "[kernels][twin][" + twin.family + "]";
  const Catch::SourceLineInfo where(__FILE__, __LINE__);
  Catch::AutoReg(new TwinTest(twin, true), where, Catch::StringRef(),
                 Catch::NameAndTags(gpu_name, gpu_tags));
  Catch::AutoReg(new TwinTest(twin, false), where, Catch::StringRef(),
                 Catch::NameAndTags(cpu_name, cpu_tags));
}

const std::vector<TwinCase>& twin_cases() { return registry(); }

void check_twin_on_gpu(const TwinCase& twin) {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  TwinSide reference(cpu, true), device(gpu, false);
  twin.run(reference);
  twin.run(device);
  check_expectations(reference);
  check_expectations(device);
  REQUIRE(!reference.outputs().empty());
  REQUIRE(device.outputs().size() == reference.outputs().size());
  for (size_t i = 0; i < reference.outputs().size(); ++i) {
    const TwinOutput& want = reference.outputs()[i];
    const TwinOutput& got = device.outputs()[i];
    REQUIRE(got.name == want.name);
    const Errors e = measure_errors(got.values, want.values);
    const bool pass = within(e, want.tolerance);
    std::printf("twin %s: %s | %-12s | max abs %9.3e | max rel %9.3e | rel to scale %9.3e | "
                "%-22s | %s\n",
                twin.family.c_str(), twin.name.c_str(), want.name.c_str(), e.max_abs, e.max_rel,
                e.scaled, describe(want.tolerance).c_str(), pass ? "pass" : "FAIL");
    INFO(want.name << ": " << measure_name(want.tolerance.measure) << " "
                   << measured(e, want.tolerance.measure) << ", tolerance "
                   << describe(want.tolerance) << " (" << want.tolerance.reason << ")");
    CHECK(pass);
  }
}

void check_twin_reference(const TwinCase& twin) {
  Context cpu;
  TwinSide reference(cpu, true);
  twin.run(reference);
  check_expectations(reference);
  REQUIRE(!reference.outputs().empty());
  for (const TwinOutput& out : reference.outputs()) {
    const bool finite = std::all_of(out.values.begin(), out.values.end(),
                                    [](double v) { return std::isfinite(v); });
    INFO(out.name << " holds a value that is not finite");
    CHECK(finite);
  }
}

}  // namespace fsdp::testing
