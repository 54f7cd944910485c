// Module trees and parameters: dotted names, kinds, weight-decay flags, gradient dtypes,
// gradient accumulation across backward calls, and the contract FSDP relies on: backward
// reads parameter.data and parameter.grad when it runs, so both may be replaced (by views
// into flat buffers) between forward and backward.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "runtime/nn/layers.h"
#include "tests/test_support.h"

namespace fsdp::nn {
namespace {

models::ModelConfig tiny(models::Family family) {
  models::ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = 8;
  c.n_head = 2;
  c.n_kv_head = family == models::Family::Llama ? 1 : 0;
  c.d_ff = family == models::Family::Llama ? 12 : 0;
  c.vocab_size = 10;
  c.padded_vocab_size = 16;
  c.seq_len = 6;
  c.tie_embeddings = family == models::Family::GPT2;
  return c;
}

std::vector<std::string> names(Module& m) {
  std::vector<std::string> out;
  for (Parameter* p : m.named_parameters()) out.push_back(p->name());
  return out;
}

TEST_CASE("GPT-2 parameters have dotted names, listed once, in a fixed order", "[nn][module]") {
  auto model = models::build_model(tiny(models::Family::GPT2));
  const std::vector<std::string> n = names(*model);
  const std::vector<std::string> block = {
      "ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
      "attn.proj.bias", "ln_2.weight", "ln_2.bias", "mlp.fc.weight", "mlp.fc.bias",
      "mlp.proj.weight", "mlp.proj.bias"};
  std::vector<std::string> expected = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 2; ++i)
    for (const std::string& b : block) expected.push_back("h." + std::to_string(i) + "." + b);
  expected.push_back("ln_f.weight");
  expected.push_back("ln_f.bias");
  CHECK(n == expected);
  Parameter* qkv = model->find_parameter("h.1.attn.qkv.weight");
  REQUIRE(qkv != nullptr);
  CHECK(qkv->shape() == Shape{24, 8});
  CHECK(qkv->local_name() == "weight");
  CHECK(model->find_parameter("lm_head.weight") == nullptr);  // tied: no second copy
  CHECK(model->name().empty());
  CHECK(model->blocks().size() == 2);
  CHECK(model->blocks()[1]->name() == "h.1");
  CHECK(model->modules_of_kind("attention").size() == 2);
  CHECK(model->modules_of_kind("attention")[0]->name() == "h.0.attn");
}

TEST_CASE("Llama parameters: fused projections, GQA shapes, untied head", "[nn][module]") {
  auto model = models::build_model(tiny(models::Family::Llama));
  // qkv: (H + 2 Hkv) D = (2 + 2) * 4 rows.
  CHECK(model->find_parameter("layers.0.attn.qkv.weight")->shape() == Shape{16, 8});
  CHECK(model->find_parameter("layers.0.attn.proj.weight")->shape() == Shape{8, 8});
  CHECK(model->find_parameter("layers.1.mlp.gate_up.weight")->shape() == Shape{24, 8});
  CHECK(model->find_parameter("layers.1.mlp.proj.weight")->shape() == Shape{8, 12});
  CHECK(model->find_parameter("lm_head.weight")->shape() == Shape{16, 8});
  CHECK(model->find_parameter("embed.weight")->shape() == Shape{16, 8});
  CHECK(model->find_parameter("layers.0.attn.qkv.bias") == nullptr);
  models::ModelConfig tied = tiny(models::Family::Llama);
  tied.tie_embeddings = true;
  CHECK(models::build_model(tied)->find_parameter("lm_head.weight") == nullptr);
}

TEST_CASE("weight decay applies to 2-D weights and embeddings only", "[nn][module]") {
  for (models::Family f : {models::Family::GPT2, models::Family::Llama}) {
    auto model = models::build_model(tiny(f));
    for (Parameter* p : model->named_parameters()) {
      INFO(p->name());
      CHECK(p->weight_decay() == (p->shape().rank() == 2));
    }
  }
}

TEST_CASE("a model built as specs allocates nothing until materialized", "[nn][module]") {
  Context ctx;
  auto model = models::build_model(tiny(models::Family::GPT2));
  for (Parameter* p : model->named_parameters()) CHECK_FALSE(p->data.defined());
  CHECK_THROWS_AS(model->find_parameter("wte.weight")->checked_data(), ValueError);
  materialize(ctx, *model, DType::bf16, 1);
  for (Parameter* p : model->named_parameters()) {
    CHECK(p->data.dtype() == DType::bf16);
    CHECK(p->data.shape() == p->shape());
    CHECK_FALSE(p->grad.defined());
    CHECK(p->grad_dtype() == DType::f32);  // 16-bit weights accumulate f32 gradients
  }
  set_grad_dtype(*model, DType::bf16);
  CHECK(model->find_parameter("ln_f.bias")->grad_dtype() == DType::bf16);
}

class Twice : public Module {
 public:
  std::string kind() const override { return "twice"; }
  Linear a{2, 2, false, InitRule::zeros()};
  void add_twice() {
    add_module("a", a);
    add_module("b", a);
  }
  void same_name() { add_module("a", a); }
};

TEST_CASE("registering a module twice is an error", "[nn][module]") {
  Twice t;
  CHECK_THROWS_AS(t.add_twice(), ValueError);
  Twice u;
  u.same_name();
  CHECK(u.named_parameters().size() == 1);
  CHECK(u.named_parameters()[0]->name() == "a.weight");
}

// Runs forward + backward of a tiny GPT-2 on one batch (f64).
void step(Context& ctx, models::LanguageModel& model, uint64_t seed) {
  std::vector<int32_t> idx, tgt;
  for (int i = 0; i < 12; ++i) {
    idx.push_back(int32_t((seed * 7 + uint64_t(i) * 3) % 10));
    tgt.push_back(int32_t((seed * 5 + uint64_t(i) * 7) % 10));
  }
  Graph g(ctx);
  const Tensor loss = model.forward(g, ops::from_host<int32_t>(ctx, idx, Shape{2, 6}),
                                    ops::from_host<int32_t>(ctx, tgt, Shape{2, 6}));
  g.backward(loss, 1.0);
}

std::vector<std::vector<double>> grads(Context& ctx, Module& m) {
  std::vector<std::vector<double>> out;
  for (Parameter* p : m.named_parameters()) out.push_back(ops::to_vector<double>(ctx, p->grad));
  return out;
}

TEST_CASE("two backward calls accumulate the sum of their gradients", "[nn][module]") {
  Context ctx;
  for (models::Family f : {models::Family::GPT2, models::Family::Llama}) {
    INFO(models::family_name(f));
    auto model = models::build_model(tiny(f));
    materialize(ctx, *model, DType::f64, 5);
    step(ctx, *model, 1);
    const auto a = grads(ctx, *model);
    release_grads(*model);
    step(ctx, *model, 2);
    const auto b = grads(ctx, *model);
    release_grads(*model);
    step(ctx, *model, 1);
    step(ctx, *model, 2);  // no zeroing in between: micro-batches
    const auto sum = grads(ctx, *model);
    for (size_t i = 0; i < a.size(); ++i) {
      double err = 0, scale = 0;
      for (size_t j = 0; j < a[i].size(); ++j) {
        err = std::max(err, std::fabs(sum[i][j] - (a[i][j] + b[i][j])));
        scale = std::max(scale, std::fabs(a[i][j] + b[i][j]));
      }
      INFO(model->named_parameters()[i]->name());
      CHECK(scale > 0);
      // Only the order of the additions differs (f64).
      CHECK(err <= 1e-13 * scale);
    }
    zero_grad(ctx, *model);
    for (const auto& g : grads(ctx, *model))
      for (double v : g) CHECK(v == 0);
  }
}

TEST_CASE("gradients accumulate into views of a flat buffer installed by their owner",
          "[nn][module]") {
  Context ctx;
  auto model = models::build_model(tiny(models::Family::GPT2));
  materialize(ctx, *model, DType::f64, 5);
  step(ctx, *model, 3);
  const auto reference = grads(ctx, *model);
  // One flat buffer, every gradient a view into it (as FSDP lays them out), pre-filled
  // with 1 to show that backward adds rather than overwrites.
  const std::vector<Parameter*> params = model->named_parameters();
  int64_t total = 0;
  for (Parameter* p : params) total += p->numel();
  Tensor flat = ops::full(ctx, Shape{total}, DType::f64, 1.0);
  int64_t offset = 0;
  for (Parameter* p : params) {
    p->grad = flat.narrow(0, offset, p->numel()).view(p->shape());
    offset += p->numel();
  }
  step(ctx, *model, 3);
  const std::vector<double> all = ops::to_vector<double>(ctx, flat);
  offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    // A parameter with several contributions (the tied wte) adds them to the 1 one at a
    // time, so the result may differ from 1 + reference in the last bit (f64).
    for (size_t j = 0; j < reference[i].size(); ++j)
      REQUIRE(all[size_t(offset) + j] == Approx(1.0 + reference[i][j]).epsilon(1e-14));
    offset += params[i]->numel();
  }
}

TEST_CASE("backward reads the weights installed at backward time", "[nn][module]") {
  // ZeRO-3 frees a unit's gathered weights after forward and gathers them again (into
  // another buffer) before backward.
  Context ctx;
  Linear lin(3, 2, false, InitRule::normal(0, 1));
  materialize(ctx, lin, DType::f64, 9);
  const Tensor w = lin.weight().data;
  const Tensor x = Graph::leaf(ops::from_vector(ctx, {1, 2, 3}, Shape{1, 3}, DType::f64));
  Graph g(ctx);
  const Tensor y = lin(g, x);
  lin.weight().data = Tensor();  // "resharded": forward must not have kept its own copy
  Tensor doubled = ctx.empty(w.shape(), DType::f64);
  ops::scale(ctx, doubled, w, 2.0);
  lin.weight().data = doubled;  // "gathered again", into a new buffer (values doubled to tell)
  g.backward(y, ops::full(ctx, Shape{1, 2}, DType::f64, 1.0));
  const std::vector<double> wv = ops::to_vector<double>(ctx, w);
  const std::vector<double> dx = ops::to_vector<double>(ctx, Graph::grad(x));
  for (int j = 0; j < 3; ++j) CHECK(dx[size_t(j)] == 2 * (wv[size_t(j)] + wv[size_t(3 + j)]));
}

}  // namespace
}  // namespace fsdp::nn
