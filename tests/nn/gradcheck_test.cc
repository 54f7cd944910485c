// Every differentiable op's backward, and whole GPT-2 and Llama blocks and models (with and
// without activation recompute), checked against central finite differences in f64 on the
// CPU, over two sets of shapes.
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "tests/nn/gradcheck.h"
#include "tests/test_support.h"

namespace fsdp::testing {
namespace {

using autograd::Graph;
using nn::Parameter;

// The shapes one run of the harness uses. C % H == 0, H % Hkv == 0, D = C / H even.
struct Dims {
  int64_t b, t, c, h, hkv, vocab, padded_vocab;
};

Tensor random(Context& ctx, const Shape& shape, uint64_t seed, double std = 1.0) {
  Tensor t = ctx.empty(shape, DType::f64);
  fill_random(ctx, t, seed, std);
  return t;
}

std::unique_ptr<Parameter> param(Context& ctx, const std::string& name, const Shape& shape,
                                 uint64_t seed, double std = 0.5) {
  auto p = std::make_unique<Parameter>(name, shape, nn::InitRule::zeros(), true);
  p->data = random(ctx, shape, seed, std);
  return p;
}

// Token ids in [0, vocab) (with repeats), and -1 where `ignore_every` says.
Tensor tokens(Context& ctx, int64_t b, int64_t t, int64_t vocab, uint64_t seed,
              int64_t ignore_every = 0) {
  std::vector<int32_t> ids;
  uint64_t s = seed;
  for (int64_t i = 0; i < b * t; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const bool ignored = ignore_every > 0 && i % ignore_every == ignore_every - 1;
    ids.push_back(ignored ? -1 : int32_t((s >> 33) % uint64_t(vocab)));
  }
  return ops::from_host<int32_t>(ctx, ids, Shape{b, t});
}

// Gives every parameter of a model random f64 values (norm gains and biases too: an
// all-ones gain would hide a backward that forgets it).
void randomize(Context& ctx, nn::Module& m, uint64_t seed) {
  nn::materialize(ctx, m, DType::f64, seed);
  uint64_t i = 0;
  for (Parameter* p : m.named_parameters()) fill_random(ctx, p->data, seed + 100 * ++i, 0.5);
}

std::vector<Parameter*> raw(const std::vector<std::unique_ptr<Parameter>>& ps) {
  std::vector<Parameter*> out;
  for (const auto& p : ps) out.push_back(p.get());
  return out;
}

models::ModelConfig tiny_config(models::Family family, const Dims& d) {
  models::ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = d.c;
  c.n_head = d.h;
  c.n_kv_head = family == models::Family::GPT2 ? d.h : d.hkv;
  c.d_ff = family == models::Family::GPT2 ? 4 * d.c : 3 * d.c;
  c.vocab_size = d.vocab;
  c.padded_vocab_size = d.padded_vocab;
  c.seq_len = d.t + 2;
  c.rope_theta = 50.0;
  c.tie_embeddings = family == models::Family::GPT2;
  return c;
}

const Dims kShapes[] = {
    {2, 3, 8, 2, 1, 11, 16},
    {1, 5, 16, 4, 2, 13, 16},
};

TEST_CASE("finite differences: every op's backward", "[nn][gradcheck]") {
  Context ctx;
  const Dims d = GENERATE(values({kShapes[0], kShapes[1]}));
  INFO("B=" << d.b << " T=" << d.t << " C=" << d.c << " H=" << d.h << " Hkv=" << d.hkv
            << " V=" << d.vocab << " Vp=" << d.padded_vocab);
  const int64_t b = d.b, t = d.t, c = d.c;

  SECTION("linear, every bias/epilogue combination") {
    for (bool bias : {false, true})
      for (ops::Epilogue ep : {ops::Epilogue::None, ops::Epilogue::Gelu}) {
        std::vector<std::unique_ptr<Parameter>> ps;
        ps.push_back(param(ctx, "weight", Shape{2 * c, c}, 1));
        if (bias) ps.push_back(param(ctx, "bias", Shape{2 * c}, 2));
        Parameter* w = ps[0].get();
        Parameter* bp = bias ? ps[1].get() : nullptr;
        check_gradients(ctx, {str_cat("linear bias=", bias, " gelu=", ep == ops::Epilogue::Gelu),
                              {random(ctx, Shape{b, t, c}, 3)}, raw(ps),
                              [=](Graph& g, const std::vector<Tensor>& in) {
                                return nn::linear(g, in[0], *w, bp, ep);
                              }});
      }
  }
  SECTION("the fused MLP: GELU and SwiGLU, with and without bias and activation recompute") {
    for (nn::MlpActivation act : {nn::MlpActivation::Gelu, nn::MlpActivation::SwiGLU})
      for (bool bias : {false, true})
        for (bool recompute : {false, true}) {
          const int64_t f = 3 * c, hf = act == nn::MlpActivation::Gelu ? f : 2 * f;
          std::vector<std::unique_ptr<Parameter>> ps;
          ps.push_back(param(ctx, "fc.weight", Shape{hf, c}, 31));
          ps.push_back(param(ctx, "proj.weight", Shape{c, f}, 32));
          if (bias) {
            ps.push_back(param(ctx, "fc.bias", Shape{hf}, 33));
            ps.push_back(param(ctx, "proj.bias", Shape{c}, 34));
          }
          Parameter* fc = ps[0].get();
          Parameter* proj = ps[1].get();
          Parameter* fc_b = bias ? ps[2].get() : nullptr;
          Parameter* proj_b = bias ? ps[3].get() : nullptr;
          check_gradients(ctx, {str_cat("mlp ", act == nn::MlpActivation::Gelu ? "gelu" : "swiglu",
                                        " bias=", bias, " recompute=", recompute),
                                {random(ctx, Shape{b, t, c}, 35)}, raw(ps),
                                [=](Graph& g, const std::vector<Tensor>& in) {
                                  return nn::mlp(g, in[0], *fc, fc_b, *proj, proj_b, act, recompute);
                                }});
        }
  }
  SECTION("embedding, without and with learned positions") {
    const Tensor idx = tokens(ctx, b, t, d.vocab, 5);
    auto wte = param(ctx, "wte", Shape{d.vocab, c}, 6);
    auto wpe = param(ctx, "wpe", Shape{t + 2, c}, 7);
    Parameter* wte_p = wte.get();
    Parameter* wpe_p = wpe.get();
    check_gradients(ctx, {"embedding", {}, {wte_p}, [=](Graph& g, const std::vector<Tensor>&) {
                            return nn::embedding(g, idx, *wte_p);
                          }});
    check_gradients(ctx, {"embedding + positions", {}, {wte_p, wpe_p},
                          [=](Graph& g, const std::vector<Tensor>&) {
                            return nn::embedding(g, idx, *wte_p, wpe_p);
                          }});
  }
  SECTION("layer_norm and rms_norm") {
    auto w = param(ctx, "weight", Shape{c}, 8);
    auto bias = param(ctx, "bias", Shape{c}, 9);
    Parameter* wp = w.get();
    Parameter* bp = bias.get();
    check_gradients(ctx, {"layer_norm", {random(ctx, Shape{b, t, c}, 10, 2.0)}, {wp, bp},
                          [=](Graph& g, const std::vector<Tensor>& in) {
                            return nn::layer_norm(g, in[0], *wp, *bp, 1e-5);
                          }});
    check_gradients(ctx, {"rms_norm", {random(ctx, Shape{b, t, c}, 11, 2.0)}, {wp},
                          [=](Graph& g, const std::vector<Tensor>& in) {
                            return nn::rms_norm(g, in[0], *wp, 1e-5);
                          }});
  }
  SECTION("the residual add fused into layer_norm and rms_norm") {
    auto w = param(ctx, "weight", Shape{c}, 40);
    auto bias = param(ctx, "bias", Shape{c}, 41);
    Parameter* wp = w.get();
    Parameter* bp = bias.get();
    // Both outputs feed the result: the sum's gradient arrives adopted from the add, so the
    // norm's backward adds its gradient to it out of place (Graph::grad_sink_or_addend).
    check_gradients(ctx, {"add_layer_norm",
                          {random(ctx, Shape{b, t, c}, 42, 2.0), random(ctx, Shape{b, t, c}, 43)},
                          {wp, bp}, [=](Graph& g, const std::vector<Tensor>& in) {
                            const nn::AddNorm r = nn::add_layer_norm(g, in[0], in[1], *wp, *bp, 1e-5);
                            return nn::add(g, r.sum, nn::gelu(g, r.out));
                          }});
    check_gradients(ctx, {"add_rms_norm",
                          {random(ctx, Shape{b, t, c}, 44, 2.0), random(ctx, Shape{b, t, c}, 45)},
                          {wp}, [=](Graph& g, const std::vector<Tensor>& in) {
                            const nn::AddNorm r = nn::add_rms_norm(g, in[0], in[1], *wp, 1e-5);
                            return nn::add(g, r.sum, nn::gelu(g, r.out));
                          }});
    // One tensor as both x and residual.
    check_gradients(ctx, {"add_layer_norm(x, x)", {random(ctx, Shape{b, t, c}, 46, 2.0)}, {wp, bp},
                          [=](Graph& g, const std::vector<Tensor>& in) {
                            const nn::AddNorm r = nn::add_layer_norm(g, in[0], in[0], *wp, *bp, 1e-5);
                            return nn::add(g, r.sum, r.out);
                          }});
  }
  SECTION("gelu, swiglu and the residual add") {
    check_gradients(ctx, {"gelu", {random(ctx, Shape{b, t, c}, 12, 2.0)}, {},
                          [](Graph& g, const std::vector<Tensor>& in) { return nn::gelu(g, in[0]); }});
    check_gradients(ctx, {"swiglu", {random(ctx, Shape{b, t, 2 * c}, 13, 2.0)}, {},
                          [](Graph& g, const std::vector<Tensor>& in) { return nn::swiglu(g, in[0]); }});
    check_gradients(ctx, {"add", {random(ctx, Shape{b, t, c}, 14), random(ctx, Shape{b, t, c}, 15)},
                          {}, [](Graph& g, const std::vector<Tensor>& in) {
                            return nn::add(g, in[0], in[1]);
                          }});
    // One tensor on both sides: its gradient is the sum of both.
    check_gradients(ctx, {"add(x, x)", {random(ctx, Shape{b, t, c}, 16)}, {},
                          [](Graph& g, const std::vector<Tensor>& in) {
                            return nn::add(g, in[0], in[0]);
                          }});
  }
  SECTION("rope") {
    check_gradients(ctx, {"rope", {random(ctx, Shape{b, t, d.h, c / d.h}, 17)}, {},
                          [](Graph& g, const std::vector<Tensor>& in) {
                            return nn::rope(g, in[0], 50.0);
                          }});
  }
  SECTION("attention: multi-head, grouped-query with rotary, multi-query") {
    const int64_t hd = c / d.h;
    struct Variant {
      const char* name;
      int64_t kv;
      double theta;
    };
    for (const Variant& v : {Variant{"MHA", d.h, 0.0}, Variant{"GQA + rope", d.hkv, 50.0},
                             Variant{"MQA", 1, 0.0}}) {
      const int64_t h = d.h, kv = v.kv;
      const double theta = v.theta;
      check_gradients(ctx, {std::string("attention ") + v.name,
                            {random(ctx, Shape{b, t, (h + 2 * kv) * hd}, 18)}, {},
                            [=](Graph& g, const std::vector<Tensor>& in) {
                              return nn::causal_attention(g, in[0], h, kv, theta);
                            }});
    }
  }
  SECTION("cross-entropy with padded vocabulary and ignored targets") {
    const Tensor targets = tokens(ctx, b, t, d.vocab, 19, /*ignore_every=*/3);
    const int64_t vocab = d.vocab;
    check_gradients(ctx, {"cross_entropy", {random(ctx, Shape{b, t, d.padded_vocab}, 20, 2.0)}, {},
                          [=](Graph& g, const std::vector<Tensor>& in) {
                            return nn::cross_entropy(g, in[0], targets, vocab);
                          }});
    // Logits produced by an op: the backward then works in place in the logits buffer.
    auto head = param(ctx, "head", Shape{d.padded_vocab, c}, 21);
    Parameter* hp = head.get();
    check_gradients(ctx, {"linear -> cross_entropy (in place)", {random(ctx, Shape{b, t, c}, 22)},
                          {hp}, [=](Graph& g, const std::vector<Tensor>& in) {
                            return nn::cross_entropy(g, nn::linear(g, in[0], *hp), targets, vocab);
                          }});
  }
}

TEST_CASE("finite differences: GPT-2 and Llama blocks, plain and recomputed",
          "[nn][gradcheck][models]") {
  Context ctx;
  const Dims d = GENERATE(values({kShapes[0], kShapes[1]}));
  const bool recompute = GENERATE(false, true);
  INFO("C=" << d.c << " H=" << d.h << " Hkv=" << d.hkv << " recompute=" << recompute);
  const Tensor x = random(ctx, Shape{d.b, d.t, d.c}, 30);

  models::GPT2Block gpt2(tiny_config(models::Family::GPT2, d).resolved());
  randomize(ctx, gpt2, 31);
  gpt2.set_recompute(recompute);
  check_gradients(ctx, {"GPT-2 block", {x}, gpt2.named_parameters(),
                        [&](Graph& g, const std::vector<Tensor>& in) { return gpt2(g, in[0]); }});

  models::LlamaBlock llama(tiny_config(models::Family::Llama, d).resolved());
  randomize(ctx, llama, 32);
  llama.set_recompute(recompute);
  check_gradients(ctx, {"Llama block", {x}, llama.named_parameters(),
                        [&](Graph& g, const std::vector<Tensor>& in) { return llama(g, in[0]); }});
}

TEST_CASE("finite differences: whole GPT-2 and Llama models to the loss",
          "[nn][gradcheck][models]") {
  Context ctx;
  const Dims d = kShapes[0];
  for (models::Family family : {models::Family::GPT2, models::Family::Llama}) {
    for (const char* recompute : {"none", "full", "selective"}) {
      INFO(models::family_name(family) << " recompute=" << recompute);
      auto model = models::build_model(tiny_config(family, d));
      randomize(ctx, *model, 40);
      models::set_activation_recompute(*model, models::recompute_from_name(recompute));
      const Tensor idx = tokens(ctx, d.b, d.t, d.vocab, 41);
      const Tensor targets = tokens(ctx, d.b, d.t, d.vocab, 42, /*ignore_every=*/4);
      check_gradients(ctx, {str_cat(models::family_name(family), " model, recompute ", recompute),
                            {}, model->named_parameters(),
                            [&](Graph& g, const std::vector<Tensor>&) {
                              return model->forward(g, idx, targets);
                            }});
    }
  }
}

// A view whose head dimension is strided (views of the graph's leaves carry no gradient, so
// only a forward without one meets it): rotated as its contiguous copy is.
TEST_CASE("rope of a view whose head dimension is strided", "[nn]") {
  Context ctx;
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  const Tensor x = random(ctx, Shape{2, 3, 8, 2}, 19).transpose(2, 3);  // (B, T, H, D) strided D
  const Tensor want = nn::rope(g, ops::contiguous(ctx, x), 50.0);
  CHECK(ops::compare(ctx, nn::rope(g, x, 50.0), want).max_abs == 0.0);
}

}  // namespace
}  // namespace fsdp::testing
