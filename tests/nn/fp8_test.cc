// FP8 linear layers (runtime/nn/fp8.h): nn::fp8_linear and nn::fp8_mlp are exactly the FP8
// products of their quantized operands in the layouts the FP8 matmul needs, within FP8's
// error of the exact layer; the MLP op equals its layers composed, with and without the
// activation recompute; Linear and the MLPs take FP8 from outside and fall back outside
// training only; the FP8 plan picks the right layers; and on a GPU the ops match the CPU
// simulation.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/fp8_math.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/nn/fp8_plan.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "runtime/nn/layers.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

namespace fsdp::testing {
namespace {

using autograd::Graph;
using nn::Fp8Recipe;
using nn::Parameter;

const Fp8Recipe kHybrid{DType::f8e4m3, DType::f8e5m2};
const Fp8Recipe kE4m3{DType::f8e4m3, DType::f8e4m3};

std::unique_ptr<Parameter> param(Context& ctx, const std::string& name, const Shape& shape,
                                 DType dt, uint32_t seed, double range) {
  auto p = std::make_unique<Parameter>(name, shape, nn::InitRule::zeros(), true);
  p->data = random_tensor(ctx, shape, dt, seed, -range, range);
  return p;
}

// x (R, C) quantized: as stored, transposed, and its scales.
struct Q {
  Tensor q, q_t, scales;
};
Q quantize(Context& ctx, const Tensor& x, DType fp8) {
  Q r{ctx.empty(x.shape(), fp8), ctx.empty(Shape{x.size(1), x.size(0)}, fp8),
      ctx.empty(Shape{kernels::kFp8Scales}, DType::f32)};
  ops::fp8_scales(ctx, r.scales, x, fp8);
  ops::fp8_quantize(ctx, r.q, r.q_t, x, r.scales);
  return r;
}

// out (M, N) = a (M, K) @ b (N, K)^T in FP8 (a's dtype, b's dtype), f32 out.
Tensor fp8_product(Context& ctx, const Q& a, const Q& b, bool a_t, bool b_t, int64_t m, int64_t n,
                   DType out = DType::f32) {
  Tensor o = ctx.empty(Shape{m, n}, out);
  ops::fp8_matmul(ctx, o, a_t ? a.q_t : a.q, a.scales, b_t ? b.q_t : b.q, b.scales);
  return o;
}

// max |a - b| / max |b|.
double scaled_error(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return a.size() == b.size() ? worst / scale : INFINITY;
}

// |a - b| / |b| in the L2 norm.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace

TEST_CASE("fp8_linear: forward and gradients are the FP8 products of the quantized operands",
          "[nn][fp8]") {
  Context ctx;
  const int64_t b = 2, t = 16, in = 48, out = 32, n = b * t;
  for (const Fp8Recipe& recipe : {kHybrid, kE4m3}) {
    INFO(recipe.str());
    auto w = param(ctx, "w", Shape{out, in}, DType::f32, 1, 0.5);
    auto bias = param(ctx, "b", Shape{out}, DType::f32, 2, 0.5);
    const Tensor x = random_tensor(ctx, Shape{b, t, in}, DType::f32, 3, -2, 2);
    const Tensor dy = random_tensor(ctx, Shape{b, t, out}, DType::f32, 4, -1e-3, 1e-3);
    Graph g(ctx);
    const Tensor xl = Graph::leaf(x);
    const Tensor y = nn::fp8_linear(g, xl, *w, bias.get(), ops::Epilogue::None, recipe);
    g.backward(y, dy);
    CHECK(g.num_nodes() == 0);

    // The same products by hand: forward x @ W^T, dgrad dy @ (W^T)^T, wgrad dy^T @ (x^T)^T.
    const Tensor x2 = x.view(Shape{n, in}), dy2 = dy.view(Shape{n, out});
    const Q xq = quantize(ctx, x2, recipe.forward), wq = quantize(ctx, w->data, recipe.forward);
    const Q gq = quantize(ctx, dy2, recipe.backward);
    Tensor y_ref = ctx.empty(Shape{n, out}, DType::f32);
    ops::fp8_matmul(ctx, y_ref, xq.q, xq.scales, wq.q, wq.scales, 0.0, bias->data);
    const Tensor dx_ref = fp8_product(ctx, gq, wq, false, true, n, in);
    const Tensor dw_ref = fp8_product(ctx, gq, xq, true, true, out, in);
    CHECK(values(ctx, y) == values(ctx, y_ref));
    CHECK(values(ctx, Graph::grad(xl)) == values(ctx, dx_ref));
    CHECK(values(ctx, w->grad) == values(ctx, dw_ref));
    Tensor db_ref = ctx.empty(Shape{out}, DType::f32);
    ops::bias_backward(ctx, db_ref, dy2, false);
    CHECK(values(ctx, bias->grad) == values(ctx, db_ref));

    // Against the exact layer: FP8's error, and not less (the products did run in FP8).
    Graph ge(ctx);
    auto w_exact = param(ctx, "w", Shape{out, in}, DType::f32, 1, 0.5);
    auto b_exact = param(ctx, "b", Shape{out}, DType::f32, 2, 0.5);
    const Tensor xe = Graph::leaf(ops::clone(ctx, x));
    const Tensor ye = nn::linear(ge, xe, *w_exact, b_exact.get());
    ge.backward(ye, dy);
    // e4m3 keeps 3 mantissa bits (2^-4 relative error per operand at most), e5m2 2 (2^-3);
    // over sums of 32 to 48 products the errors partly cancel: measured 3.5% of the scale
    // forward, 3% (e4m3) and 5.5% (e5m2) for the gradients.
    const double fwd = scaled_error(values(ctx, y), values(ctx, ye));
    const double dx = scaled_error(values(ctx, Graph::grad(xl)), values(ctx, Graph::grad(xe)));
    const double dw = scaled_error(values(ctx, w->grad), values(ctx, w_exact->grad));
    INFO("scaled errors: forward " << fwd << ", dx " << dx << ", dW " << dw);
    CHECK(fwd > 1e-4);
    CHECK(fwd < 0.06);
    CHECK(dx < (recipe.backward == DType::f8e5m2 ? 0.1 : 0.05));
    CHECK(dw < (recipe.backward == DType::f8e5m2 ? 0.1 : 0.05));
  }
}

TEST_CASE("fp8_linear with GELU: the pre-activation's gradient goes through FP8 like dy",
          "[nn][fp8]") {
  Context ctx;
  const int64_t n = 32, in = 16, out = 64;
  auto w = param(ctx, "w", Shape{out, in}, DType::f32, 5, 0.5);
  const Tensor x = random_tensor(ctx, Shape{n, in}, DType::f32, 6, -2, 2);
  const Tensor dy = random_tensor(ctx, Shape{n, out}, DType::f32, 7);
  Graph g(ctx);
  const Tensor xl = Graph::leaf(x);
  const Tensor y = nn::fp8_linear(g, xl, *w, nullptr, ops::Epilogue::Gelu, kHybrid);
  g.backward(y, dy);
  const Q xq = quantize(ctx, x, DType::f8e4m3), wq = quantize(ctx, w->data, DType::f8e4m3);
  const Tensor pre = fp8_product(ctx, xq, wq, false, false, n, out);
  Tensor act = ctx.empty(Shape{n, out}, DType::f32), dpre = ctx.empty(Shape{n, out}, DType::f32);
  ops::gelu_forward(ctx, act, pre);
  ops::gelu_backward(ctx, dpre, dy, pre);
  CHECK(values(ctx, y) == values(ctx, act));
  const Q gq = quantize(ctx, dpre, DType::f8e5m2);
  CHECK(values(ctx, Graph::grad(xl)) == values(ctx, fp8_product(ctx, gq, wq, false, true, n, in)));
  CHECK(values(ctx, w->grad) == values(ctx, fp8_product(ctx, gq, xq, true, true, out, in)));
}

TEST_CASE("fp8_mlp equals its FP8 layers composed, bit for bit, with and without recompute",
          "[nn][fp8]") {
  Context ctx;
  const int64_t b = 2, t = 16, c = 32, f = 64;
  for (nn::MlpActivation act : {nn::MlpActivation::Gelu, nn::MlpActivation::SwiGLU}) {
    const bool gelu = act == nn::MlpActivation::Gelu;
    for (bool recompute : {false, true}) {
      INFO((gelu ? "GELU" : "SwiGLU") << (recompute ? ", recompute" : ""));
      const int64_t h = gelu ? f : 2 * f;
      auto make = [&](uint32_t s) {
        struct P {
          std::unique_ptr<Parameter> fc, fc_b, proj, proj_b;
        };
        return P{param(ctx, "fc", Shape{h, c}, DType::f32, s, 0.3),
                 param(ctx, "fc_b", Shape{h}, DType::f32, s + 1, 0.3),
                 param(ctx, "proj", Shape{c, f}, DType::f32, s + 2, 0.3),
                 param(ctx, "proj_b", Shape{c}, DType::f32, s + 3, 0.3)};
      };
      auto p = make(10), q = make(10);
      const Tensor x = random_tensor(ctx, Shape{b, t, c}, DType::f32, 20, -2, 2);
      const Tensor dy = random_tensor(ctx, Shape{b, t, c}, DType::f32, 21, -1e-2, 1e-2);
      Graph g(ctx);
      const Tensor xl = Graph::leaf(x);
      const Tensor y = nn::fp8_mlp(g, xl, *p.fc, p.fc_b.get(), *p.proj, p.proj_b.get(), act,
                                   recompute, kHybrid);
      g.backward(y, dy);

      Graph gc(ctx);
      const Tensor xc = Graph::leaf(ops::clone(ctx, x));
      const Tensor hid = nn::fp8_linear(gc, xc, *q.fc, q.fc_b.get(),
                                        gelu ? ops::Epilogue::Gelu : ops::Epilogue::None, kHybrid);
      const Tensor a = gelu ? hid : nn::swiglu(gc, hid);
      const Tensor yc = nn::fp8_linear(gc, a, *q.proj, q.proj_b.get(), ops::Epilogue::None, kHybrid);
      gc.backward(yc, dy);

      CHECK(values(ctx, y) == values(ctx, yc));
      CHECK(values(ctx, Graph::grad(xl)) == values(ctx, Graph::grad(xc)));
      CHECK(values(ctx, p.fc->grad) == values(ctx, q.fc->grad));
      CHECK(values(ctx, p.fc_b->grad) == values(ctx, q.fc_b->grad));
      CHECK(values(ctx, p.proj->grad) == values(ctx, q.proj->grad));
      CHECK(values(ctx, p.proj_b->grad) == values(ctx, q.proj_b->grad));
    }
  }
}

TEST_CASE("Linear and the MLPs run in FP8 when a plan says so, and only then", "[nn][fp8]") {
  Context ctx;
  nn::GeluMLP mlp(32, 64, true, nn::InitRule::normal(0, 0.2), nn::InitRule::normal(0, 0.2));
  nn::materialize(ctx, mlp, DType::f32, 7);
  const Tensor x = random_tensor(ctx, Shape{2, 16, 32}, DType::f32, 8);
  auto forward = [&](const Tensor& in) {
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    return values(ctx, mlp(g, in));
  };
  const std::vector<double> plain = forward(x);
  mlp.fc.set_fp8(kHybrid);
  // Only one of the MLP's layers: refused (the MLP is one op).
  CHECK_THROWS_AS(forward(x), ValueError);
  mlp.proj.set_fp8(kHybrid);
  const std::vector<double> fp8 = forward(x);
  {
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    const Tensor want = nn::fp8_mlp(g, x, mlp.fc.weight(), mlp.fc.bias(), mlp.proj.weight(),
                                    mlp.proj.bias(), nn::MlpActivation::Gelu, false, kHybrid);
    CHECK(fp8 == values(ctx, want));
  }
  CHECK(fp8 != plain);
  CHECK(scaled_error(fp8, plain) < 0.1);  // two FP8 layers: measured 6.6% of the scale
  // 15 tokens: FP8 matmuls cannot take them. Outside training the layer computes in its
  // dtype (generation); in training it is an error naming the layer.
  const Tensor odd = random_tensor(ctx, Shape{1, 15, 32}, DType::f32, 9);
  mlp.fc.set_fp8(std::nullopt);
  mlp.proj.set_fp8(std::nullopt);
  const std::vector<double> odd_plain = forward(odd);
  mlp.fc.set_fp8(kHybrid);
  mlp.proj.set_fp8(kHybrid);
  CHECK(forward(odd) == odd_plain);
  {
    Graph g(ctx);
    CHECK_THROWS_WITH(mlp(g, Graph::leaf(odd)), Catch::Matchers::Contains("15 tokens") &&
                                                    Catch::Matchers::Contains("fc"));
  }
  // A plain Linear likewise.
  nn::Linear lin(32, 48, false, nn::InitRule::normal(0, 0.2));
  nn::materialize(ctx, lin, DType::f32, 9);
  lin.set_fp8(kE4m3);
  {
    Graph g(ctx);
    const Tensor y = lin(g, Graph::leaf(x));
    Graph g2(ctx);
    const Tensor want = nn::fp8_linear(g2, x, lin.weight(), nullptr, ops::Epilogue::None, kE4m3);
    CHECK(values(ctx, y) == values(ctx, want));
  }
  // Sizes FP8 matmuls cannot take.
  nn::Linear narrow(32, 40, false, nn::InitRule::normal(0, 0.2));
  CHECK_THROWS_AS(narrow.set_fp8(kHybrid), ShapeError);
}

namespace {

models::ModelConfig tiny(models::Family family, int n_layer) {
  models::ModelConfig c;
  c.family = family;
  c.n_layer = n_layer;
  c.d_model = 32;
  c.n_head = 2;
  c.n_kv_head = family == models::Family::Llama ? 1 : 0;
  c.vocab_size = 60;
  c.padded_vocab_size = 64;
  c.seq_len = 16;
  c.tie_embeddings = family == models::Family::GPT2;
  return c;
}

}  // namespace

TEST_CASE("the FP8 plan: the blocks' linear layers, minus the first and last when asked, "
          "never the head, a router or the experts",
          "[nn][fp8]") {
  auto gpt = models::build_model(tiny(models::Family::GPT2, 4));
  nn::Fp8Plan plan;
  plan.recipe = kHybrid;
  const nn::Fp8Layers all = nn::apply_fp8(*gpt, plan);
  CHECK(all.layers.size() == 16);  // 4 blocks x (qkv, attention proj, fc, mlp proj)
  CHECK(all.layers.front() == "h.0.attn.qkv");
  CHECK(all.kinds == std::vector<std::string>{"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"});
  CHECK(all.bf16_blocks.empty());
  plan.bf16_blocks_at_start = 1;
  plan.bf16_blocks_at_end = 2;
  const nn::Fp8Layers some = nn::apply_fp8(*gpt, plan);
  CHECK(some.layers == std::vector<std::string>{"h.1.attn.qkv", "h.1.attn.proj", "h.1.mlp.fc",
                                                "h.1.mlp.proj"});
  CHECK(some.bf16_blocks == std::vector<int>{0, 2, 3});
  // Applying again cleared the first plan's layers.
  int fp8_layers = 0;
  for (nn::Module* m : gpt->modules_of_kind("linear"))
    fp8_layers += static_cast<nn::Linear*>(m)->fp8().has_value();
  CHECK(fp8_layers == 4);
  const std::string line = some.summary("hybrid, tensorwise current scaling");
  CHECK(line == "fp8: 4 linear layers of blocks 1..1 (attn.qkv, attn.proj, mlp.fc, mlp.proj) in "
                "hybrid, tensorwise current scaling; in bf16: blocks 0, 2, 3, the head");
  plan.bf16_blocks_at_end = 3;
  CHECK_THROWS_AS(nn::apply_fp8(*gpt, plan), ConfigError);

  // A Llama with MoE layers: routers and experts stay, a shared expert's MLP runs in FP8; the
  // untied head (a Linear outside the blocks) stays.
  models::ModelConfig mc = tiny(models::Family::Llama, 2);
  mc.num_moe_experts = 4;  // a router of 4 outputs: no multiple of 16
  mc.moe_router_topk = 2;
  mc.moe_ffn_hidden_size = 16;
  mc.moe_shared_expert_intermediate_size = 32;
  mc.moe_layer_freq = 1;
  auto llama = models::build_model(mc);
  nn::Fp8Plan lp;
  lp.recipe = kE4m3;
  const nn::Fp8Layers moe = nn::apply_fp8(*llama, lp);
  for (const std::string& name : moe.layers) {
    INFO(name);
    CHECK(name.find("router") == std::string::npos);
    CHECK(name.find("lm_head") == std::string::npos);
  }
  CHECK(std::count(moe.layers.begin(), moe.layers.end(), "layers.0.mlp.shared_expert.gate_up") == 1);
}

TEST_CASE("a tiny model's loss and gradients in simulated FP8 stay near the exact ones",
          "[nn][fp8]") {
  Context ctx;
  for (models::Family family : {models::Family::GPT2, models::Family::Llama}) {
    INFO(models::family_name(family));
    auto exact = models::build_model(tiny(family, 3)), fp8 = models::build_model(tiny(family, 3));
    nn::materialize(ctx, *exact, DType::f32, 5);
    nn::materialize(ctx, *fp8, DType::f32, 5);
    nn::Fp8Plan plan;
    plan.recipe = kHybrid;
    plan.bf16_blocks_at_start = 1;
    nn::apply_fp8(*fp8, plan);
    std::vector<int32_t> idx, tgt;
    for (int i = 0; i < 32; ++i) {
      idx.push_back(int32_t((i * 7 + 3) % 60));
      tgt.push_back(int32_t((i * 11 + 5) % 60));
    }
    auto run = [&](models::LanguageModel& m) {
      Graph g(ctx);
      const Tensor loss = m.forward(g, ops::from_host<int32_t>(ctx, idx, Shape{2, 16}),
                                    ops::from_host<int32_t>(ctx, tgt, Shape{2, 16}));
      const double l = ops::item(ctx, loss);
      g.backward(loss, 1.0);
      return l;
    };
    const double le = run(*exact), lf = run(*fp8);
    CHECK(lf != le);
    // FP8's few-percent error per product averages out in the mean loss at init
    // (ln 60 = 4.1): measured within 1e-4 relative. The gradients carry it: e5m2 keeps 2
    // mantissa bits (up to 12.5% per element) and these sums are short (32 tokens, 32
    // features), so a block's gradients are measured up to 17% off in the L2 norm (those
    // of the bf16 block 0 too, which its FP8 successors feed).
    CHECK(lf == Approx(le).epsilon(1e-3));
    const std::vector<Parameter*> pe = exact->named_parameters(), pf = fp8->named_parameters();
    for (size_t i = 0; i < pe.size(); ++i) {
      INFO(pe[i]->name());
      CHECK(rel_l2(values(ctx, pf[i]->grad), values(ctx, pe[i]->grad)) < 0.25);
    }
  }
}

TEST_CASE("fp8_linear and fp8_mlp on CUDA match the CPU simulation", "[nn][fp8][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu;
  Context gpu(Device::cuda(0));
  // bf16 values on both sides: the GPU computes in bf16, the CPU in f32 on the same values,
  // so every quantized operand of the forward has the same bytes on both.
  auto both = [&](const Shape& s, uint32_t seed, double range) {
    const Tensor host = ops::cast(cpu, random_tensor(cpu, s, DType::f32, seed, -range, range), DType::bf16);
    return std::make_pair(ops::to_device(gpu, host, gpu.device()), ops::cast(cpu, host, DType::f32));
  };
  const int64_t n = 256, c = 128, f = 512;
  auto [xg, xc] = both(Shape{n, c}, 1, 2.0);
  auto [dyg, dyc] = both(Shape{n, c}, 2, 1e-2);
  auto [fcg, fcc] = both(Shape{f, c}, 3, 0.1);
  auto [prg, prc] = both(Shape{c, f}, 4, 0.1);
  auto [bfg, bfc] = both(Shape{f}, 5, 0.1);
  auto [bpg, bpc] = both(Shape{c}, 6, 0.1);
  auto parameter = [](const std::string& name, const Tensor& data) {
    auto p = std::make_unique<Parameter>(name, data.shape(), nn::InitRule::zeros(), true);
    p->data = data;
    return p;
  };
  struct Side {
    std::vector<double> y, dx, dfc, dbfc, dproj, dbproj;
  };
  auto run = [&](Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& fc, const Tensor& bf,
                 const Tensor& pr, const Tensor& bp) {
    auto pfc = parameter("fc", fc), pbf = parameter("fc_b", bf), ppr = parameter("proj", pr),
         pbp = parameter("proj_b", bp);
    Graph g(ctx);
    const Tensor xl = Graph::leaf(x);
    const Tensor y = nn::fp8_mlp(g, xl, *pfc, pbf.get(), *ppr, pbp.get(), nn::MlpActivation::Gelu,
                                 false, kHybrid);
    g.backward(y, dy);
    return Side{values(ctx, y), values(ctx, Graph::grad(xl)), values(ctx, pfc->grad),
                values(ctx, pbf->grad), values(ctx, ppr->grad), values(ctx, pbp->grad)};
  };
  const Side g = run(gpu, xg, dyg, fcg, bfg, prg, bpg);
  const Side r = run(cpu, xc, dyc, fcc, bfc, prc, bpc);
  // The forward's first product has identical operands: bf16 output rounding (2^-9) and the
  // tensor cores' accumulation apart. After it the GPU's bf16 activation and the CPU's f32 one
  // differ by a bf16 rounding, which can move an FP8 value by one step (2^-4 relative) here
  // and there; and the gradients of proj and fc go through e5m2. Measured bounds with margin.
  CHECK(scaled_error(g.y, r.y) < 2e-2);
  CHECK(scaled_error(g.dproj, r.dproj) < 2e-2);
  CHECK(scaled_error(g.dbproj, r.dbproj) < 1e-3);  // column sums of the same dy
  CHECK(scaled_error(g.dx, r.dx) < 5e-2);
  CHECK(scaled_error(g.dfc, r.dfc) < 5e-2);
  CHECK(scaled_error(g.dbfc, r.dbfc) < 5e-2);
}

}  // namespace fsdp::testing
