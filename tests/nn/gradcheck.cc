#include "tests/nn/gradcheck.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "tests/test_support.h"

namespace fsdp::testing {

using autograd::Graph;

// Step and tolerance of the comparison. In f64, with h = 1e-5 the central difference's
// truncation error is O(h^2 |f'''|) ~ 1e-10 and its rounding error O(eps |L| / h) ~ 1e-10
// for the |L| ~ 10 of these cases; a wrong backward is off by O(|grad|). 1e-6 relative to
// the largest gradient of the tensor separates the two by four orders of magnitude.
constexpr double kStep = 1e-5;
constexpr double kTolerance = 1e-6;

void fill_random(Context& ctx, const Tensor& t, uint64_t seed, double std) {
  ops::init_normal(ctx, t, seed, ops::name_key("gradcheck"), 0, 0.0, std);
}

namespace {

// L = sum(out * r) in f64.
double weighted_sum(const Tensor& out, const std::vector<double>& r, Context& ctx) {
  const std::vector<double> v = ops::to_vector<double>(ctx, ops::cast(ctx, out, DType::f64));
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

struct Checked {
  std::string name;
  Tensor data;      // the f64 CPU values that are perturbed
  Tensor analytic;  // the gradient backward produced (undefined = none)
};

}  // namespace

void check_gradients(Context& ctx, const GradCase& c) {
  INFO("case " << c.name);
  for (const Tensor& t : c.inputs) REQUIRE(t.dtype() == DType::f64);
  for (nn::Parameter* p : c.params) {
    REQUIRE(p->data.dtype() == DType::f64);
    p->grad = Tensor();
  }

  // Analytic gradients.
  std::vector<Tensor> leaves;
  for (const Tensor& t : c.inputs) leaves.push_back(Graph::leaf(t));
  std::vector<double> r;
  {
    Graph g(ctx);
    const Tensor out = c.forward(g, leaves);
    REQUIRE(Graph::tracked(out));
    Tensor rt = ctx.empty(out.shape(), DType::f64);
    fill_random(ctx, rt, 977);
    r = ops::to_vector<double>(ctx, rt);
    g.backward(out, rt);
    CHECK(g.num_nodes() == 0);
  }
  std::vector<Checked> checked;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    checked.push_back({"input " + std::to_string(i), c.inputs[i], Graph::grad(leaves[i])});
  for (nn::Parameter* p : c.params) checked.push_back({p->name(), p->data, p->grad});

  // Numeric gradients, element by element.
  auto loss = [&] {
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    const double l = weighted_sum(c.forward(g, c.inputs), r, ctx);
    return c.added_to_loss ? l + c.added_to_loss() : l;
  };
  for (const Checked& t : checked) {
    INFO("gradient of " << t.name);
    REQUIRE(t.data.is_contiguous());
    double* x = t.data.data<double>();
    std::vector<double> analytic(size_t(t.data.numel()), 0.0);
    if (t.analytic.defined()) {
      REQUIRE(t.analytic.shape() == t.data.shape());
      analytic = ops::to_vector<double>(ctx, ops::cast(ctx, t.analytic, DType::f64));
    }
    double max_err = 0, max_grad = 0;
    int64_t worst = -1;
    for (int64_t i = 0; i < t.data.numel(); ++i) {
      const double saved = x[i];
      x[i] = saved + kStep;
      const double up = loss();
      x[i] = saved - kStep;
      const double down = loss();
      x[i] = saved;
      const double numeric = (up - down) / (2 * kStep);
      const double err = std::fabs(numeric - analytic[size_t(i)]);
      max_grad = std::max(max_grad, std::fabs(numeric));
      if (err > max_err) {
        max_err = err;
        worst = i;
      }
    }
    INFO("max |analytic - numeric| = " << max_err << " at element " << worst
                                      << ", max |gradient| = " << max_grad);
    CHECK(max_err <= kTolerance * std::max(1.0, max_grad));
    CHECK(max_grad > 0);  // every checked tensor takes part in the output
    CHECK(std::any_of(analytic.begin(), analytic.end(), [](double v) { return v != 0; }));
  }
}

}  // namespace fsdp::testing
