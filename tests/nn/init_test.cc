// Initialization: any element range of any parameter, initialized alone, equals the same
// slice of a full initialization (what lets FSDP initialize only its shards), and the init
// rules of the model families.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/nn/init.h"
#include "tests/test_support.h"

namespace fsdp::nn {
namespace {

models::ModelConfig small(models::Family family) {
  models::ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = family == models::Family::Llama ? 2 : 0;
  c.vocab_size = 50;
  c.seq_len = 16;
  c.tie_embeddings = family == models::Family::GPT2;
  return c;
}

// Element ranges of a parameter of n elements: singletons at both ends, an uneven split
// into three shards (as a padded flat buffer would cut it), and a range inside.
std::vector<std::pair<int64_t, int64_t>> ranges(int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> r = {{0, 1}, {n - 1, n}, {0, n}};
  const int64_t a = n / 3 + 1, b = (2 * n) / 3 + 1;
  if (b < n) {
    r.push_back({0, a});
    r.push_back({a, b});
    r.push_back({b, n});
  }
  if (n > 10) r.push_back({n / 2 - 3, n / 2 + 4});
  return r;
}

TEST_CASE("initializing any range of any parameter alone equals that slice of the full init",
          "[nn][init]") {
  Context ctx;
  const DType dtype = GENERATE(DType::f32, DType::bf16, DType::f64);
  for (models::Family f : {models::Family::GPT2, models::Family::Llama}) {
    INFO(models::family_name(f) << " " << dtype_name(dtype));
    auto model = models::build_model(small(f));
    materialize(ctx, *model, dtype, 1234);
    for (Parameter* p : model->named_parameters()) {
      INFO(p->name());
      const std::vector<double> full =
          ops::to_vector<double>(ctx, ops::cast(ctx, p->data.flatten(), DType::f64));
      for (const auto& [begin, end] : ranges(p->numel())) {
        INFO("[" << begin << ", " << end << ")");
        Tensor shard = ctx.empty(Shape{end - begin}, dtype);
        init_parameter_range(ctx, *p, 1234, begin, shard);
        const std::vector<double> got = ops::to_vector<double>(ctx, ops::cast(ctx, shard, DType::f64));
        const std::vector<double> want(full.begin() + begin, full.begin() + end);
        REQUIRE(got == want);
      }
    }
  }
}

TEST_CASE("init ranges outside a parameter are rejected", "[nn][init]") {
  Context ctx;
  auto model = models::build_model(small(models::Family::GPT2));
  Parameter& p = *model->find_parameter("ln_f.bias");
  Tensor out = ctx.empty(Shape{4}, DType::f32);
  CHECK_THROWS_AS(init_parameter_range(ctx, p, 1, 30, out), IndexError);
  CHECK_THROWS_AS(init_parameter_range(ctx, p, 1, -1, out), IndexError);
  CHECK_NOTHROW(init_parameter_range(ctx, p, 1, 28, out));
}

double std_of(const std::vector<double>& v) {
  double s = 0, ss = 0;
  for (double x : v) {
    s += x;
    ss += x * x;
  }
  const double mean = s / double(v.size());
  return std::sqrt(ss / double(v.size()) - mean * mean);
}

TEST_CASE("GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(2L), norms 1 and 0",
          "[nn][init]") {
  Context ctx;
  models::ModelConfig c = small(models::Family::GPT2);
  c.d_model = 64;
  c.n_layer = 8;
  auto model = models::build_model(c);
  materialize(ctx, *model, DType::f32, 7);
  const double residual_std = 0.02 / std::sqrt(16.0);
  for (Parameter* p : model->named_parameters()) {
    INFO(p->name());
    const std::vector<double> v = ops::to_vector<double>(ctx, ops::cast(ctx, p->data, DType::f64));
    const std::string& n = p->name();
    const bool residual = n.find("attn.proj.weight") != std::string::npos ||
                          n.find("mlp.proj.weight") != std::string::npos;
    if (n.find(".bias") != std::string::npos) {
      CHECK(p->init().kind == InitRule::Kind::Zeros);
      for (double x : v) CHECK(x == 0);
    } else if (n.find("ln_") != std::string::npos) {
      CHECK(p->init().kind == InitRule::Kind::Ones);
      for (double x : v) CHECK(x == 1);
    } else {
      CHECK(p->init().kind == InitRule::Kind::Normal);
      CHECK(p->init().a == 0);
      CHECK(p->init().b == Approx(residual ? residual_std : 0.02));
      // The sample std of >= 3200 draws is within 5% of the rule's (about 4 sigma).
      CHECK(std_of(v) == Approx(p->init().b).epsilon(0.05));
    }
  }
}

TEST_CASE("different parameters and seeds draw different values", "[nn][init]") {
  Context ctx;
  auto model = models::build_model(small(models::Family::GPT2));
  materialize(ctx, *model, DType::f32, 1);
  const auto a = ops::to_vector<float>(ctx, model->find_parameter("h.0.attn.proj.weight")->data);
  const auto b = ops::to_vector<float>(ctx, model->find_parameter("h.1.attn.proj.weight")->data);
  CHECK(a != b);
  materialize(ctx, *model, DType::f32, 2);
  CHECK(ops::to_vector<float>(ctx, model->find_parameter("h.0.attn.proj.weight")->data) != a);
  materialize(ctx, *model, DType::f32, 1);
  CHECK(ops::to_vector<float>(ctx, model->find_parameter("h.0.attn.proj.weight")->data) == a);
}

}  // namespace
}  // namespace fsdp::nn
