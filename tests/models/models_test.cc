// The model families: llm.c's GPT-2 sizes, configs, the loss at initialization, the logits
// path, recompute modes (which must not change any number), and the sampler.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "models/generate.h"
#include "runtime/nn/init.h"
#include "tests/models/tiny_configs.h"
#include "tests/test_support.h"

namespace fsdp::models {
namespace {

Tensor ids(Context& ctx, const std::vector<int32_t>& v, int64_t b, int64_t t) {
  return ops::from_host<int32_t>(ctx, v, Shape{b, t});
}

std::vector<int32_t> pattern(int64_t n, int32_t mul, int32_t add, int32_t vocab) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(int32_t((i * mul + add) % vocab));
  return v;
}

TEST_CASE("GPT-2 d12 has llm.c's 124,475,904 parameters and shapes", "[models]") {
  const ModelConfig c = gpt2_config(12);
  CHECK(c.padded_vocab_size == 50304);
  CHECK(c.d_ff == 3072);
  auto model = build_model(c);  // specs only: no memory
  CHECK(model->num_parameters() == 124475904);
  CHECK(count_parameters(c) == 124475904);
  CHECK(model->find_parameter("wte.weight")->shape() == Shape{50304, 768});
  CHECK(model->find_parameter("wpe.weight")->shape() == Shape{1024, 768});
  CHECK(model->find_parameter("h.3.attn.qkv.weight")->shape() == Shape{2304, 768});
  CHECK(model->find_parameter("h.11.mlp.proj.weight")->shape() == Shape{768, 3072});
  CHECK(model->blocks().size() == 12);
  CHECK(model->named_parameters().size() == 2 + 12 * 12 + 2);
  CHECK(model_config("gpt2-d12").n_layer == 12);
  CHECK(count_parameters(gpt2_config(24)) > count_parameters(gpt2_config(12)));
}

TEST_CASE("Llama parameter count follows its shapes", "[models]") {
  const ModelConfig c = llama_small_config();
  const int64_t C = c.d_model, F = c.d_ff, Vp = c.padded_vocab_size, D = c.head_dim();
  const int64_t per_layer = 2 * C + (c.n_head + 2 * c.n_kv_head) * D * C + c.n_head * D * C +
                            2 * F * C + F * C;
  CHECK(count_parameters(c) == 2 * Vp * C + c.n_layer * per_layer + C);
}

TEST_CASE("configs fill defaults and reject inconsistent values", "[models]") {
  ModelConfig c;
  c.family = Family::Llama;
  c.n_layer = 1;
  c.d_model = 64;
  c.n_head = 4;
  c.vocab_size = 1000;
  c.seq_len = 32;
  const ModelConfig r = c.resolved();
  CHECK(r.n_kv_head == 4);
  CHECK(r.d_ff == 256);  // 8/3 * 64 = 171 -> multiple of 256
  CHECK(r.padded_vocab_size == 1024);
  ModelConfig bad = c;
  bad.n_head = 5;
  CHECK_THROWS_AS(bad.resolved(), ConfigError);
  bad = c;
  bad.n_kv_head = 3;
  CHECK_THROWS_AS(bad.resolved(), ConfigError);
  bad = c;
  bad.padded_vocab_size = 999;
  CHECK_THROWS_AS(bad.resolved(), ConfigError);
  bad = c;
  bad.family = Family::GPT2;
  bad.n_kv_head = 2;
  CHECK_THROWS_AS(bad.resolved(), ConfigError);
  CHECK_THROWS_AS(model_config("gpt3"), ConfigError);
  CHECK_THROWS_AS(family_from_name("bert"), ConfigError);
  CHECK(family_from_name("llama") == Family::Llama);
}

TEST_CASE("the loss at initialization is about ln(vocab)", "[models]") {
  Context ctx;
  for (Family f : {Family::GPT2, Family::Llama}) {
    INFO(family_name(f));
    auto model = build_model(tiny(f));
    nn::materialize(ctx, *model, DType::f32, 11);
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    const double loss = ops::item(ctx, model->forward(g, ids(ctx, pattern(16, 7, 3, 30), 2, 8),
                                                      ids(ctx, pattern(16, 5, 1, 30), 2, 8)));
    // Weights of std 0.02 give logits near 0: a near-uniform softmax over the 30 real tokens.
    CHECK(std::fabs(loss - std::log(30.0)) < 0.05);
  }
}

TEST_CASE("forward's logits equal the logits path; ignored targets and counts", "[models]") {
  Context ctx;
  auto model = build_model(tiny(Family::Llama));
  nn::materialize(ctx, *model, DType::f32, 12);
  const Tensor idx = ids(ctx, pattern(16, 3, 2, 30), 2, 8);
  std::vector<int32_t> t = pattern(16, 11, 4, 30);
  t[3] = t[9] = t[15] = -1;
  const Tensor targets = ids(ctx, t, 2, 8);
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  Tensor logits;
  const double counted = ops::item(ctx, model->forward(g, idx, targets, -1, &logits));
  const double given = ops::item(ctx, model->forward(g, idx, targets, 13));
  CHECK(counted == given);
  CHECK(logits.shape() == Shape{2, 8, 32});
  CHECK(ops::to_vector<float>(ctx, logits) == ops::to_vector<float>(ctx, model->logits(g, idx)));
  // The loss by hand from the logits: mean over the 13 kept rows of lse(real) - logit[target].
  const std::vector<float> l = ops::to_vector<float>(ctx, logits);
  double sum = 0;
  for (int r = 0; r < 16; ++r) {
    if (t[size_t(r)] < 0) continue;
    double m = -1e30, s = 0;
    for (int v = 0; v < 30; ++v) m = std::max(m, double(l[size_t(r * 32 + v)]));
    for (int v = 0; v < 30; ++v) s += std::exp(double(l[size_t(r * 32 + v)]) - m);
    sum += m + std::log(s) - double(l[size_t(r * 32 + t[size_t(r)])]);
  }
  CHECK(counted == Approx(sum / 13).epsilon(1e-5));
}

TEST_CASE("GPT-2 rejects sequences longer than its positions", "[models]") {
  Context ctx;
  auto model = build_model(tiny(Family::GPT2));
  nn::materialize(ctx, *model, DType::f32, 1);
  Graph g(ctx);
  const std::vector<int32_t> v = pattern(9, 1, 0, 30);
  CHECK_THROWS_AS(model->logits(g, ids(ctx, v, 1, 9)), ShapeError);
  CHECK_THROWS_AS(model->forward(g, ids(ctx, pattern(8, 1, 0, 30), 1, 8),
                                 ids(ctx, pattern(4, 1, 0, 30), 1, 4)),
                  ShapeError);
}

TEST_CASE("activation recompute changes no loss and no gradient (bitwise, CPU f32)",
          "[models][recompute]") {
  Context ctx;
  for (Family f : {Family::GPT2, Family::Llama}) {
    std::vector<std::vector<float>> reference;
    double reference_loss = 0;
    // "full1": full recompute of the first block only (recompute_num_layers = 1).
    for (std::string mode : {"none", "full", "selective", "full1"}) {
      INFO(family_name(f) << " " << mode);
      auto model = build_model(tiny(f));
      nn::materialize(ctx, *model, DType::f32, 21);
      if (mode == "full1")
        set_activation_recompute(*model, Recompute::full, 1);
      else
        set_activation_recompute(*model, recompute_from_name(mode));
      Graph g(ctx);
      const Tensor loss = model->forward(g, ids(ctx, pattern(16, 7, 1, 30), 2, 8),
                                         ids(ctx, pattern(16, 3, 5, 30), 2, 8));
      const double value = ops::item(ctx, loss);
      const size_t nodes = g.num_nodes();
      g.backward(loss, 1.0);
      std::vector<std::vector<float>> gr;
      for (nn::Parameter* p : model->named_parameters())
        gr.push_back(ops::to_vector<float>(ctx, p->grad));
      if (mode == "none") {
        reference = gr;
        reference_loss = value;
        // Every op recorded: per block norm, qkv, attention, proj, add, norm, the MLP (one
        // node), add; then embedding, final norm, and the head with the loss (one node:
        // nn::classifier_loss).
        CHECK(nodes == 2 * 8 + 3);
      } else {
        CHECK(value == reference_loss);
        CHECK(gr == reference);
      }
      if (mode == "full1") {
        CHECK(model->blocks()[0]->recompute());
        CHECK_FALSE(model->blocks()[1]->recompute());
        // The second block's 8 nodes stay; the first one's are one recompute node.
        CHECK(nodes == 1 + 8 + 3);
      }
      if (mode == "full") {
        CHECK(model->blocks()[0]->recompute());
        CHECK(nodes < 12);  // embedding, 2 recompute nodes, norm, head and loss
      }
    }
  }
  CHECK_THROWS_AS(recompute_from_name("some"), ConfigError);
  auto model = build_model(tiny(Family::GPT2));
  CHECK_THROWS_WITH(set_activation_recompute(*model, Recompute::full, 3),
                    Catch::Contains("3 blocks to recompute, but the model has 2"));
}

TEST_CASE("sample_token: greedy, top-k and temperature", "[models][generate]") {
  const std::vector<double> logits{0.5, 3.0, -1.0, 2.9};
  CHECK(sample_token(logits, 0.0, 0, 0.99) == 1);  // greedy ignores the draw
  CHECK(sample_token(logits, 1.0, 1, 0.99) == 1);
  // top-2 = {1, 3}: a draw below p(1) picks 1, above it picks 3; never 0 or 2.
  const double p1 = 1.0 / (1.0 + std::exp(2.9 - 3.0));
  CHECK(sample_token(logits, 1.0, 2, p1 - 1e-9) == 1);
  CHECK(sample_token(logits, 1.0, 2, p1 + 1e-9) == 3);
  CHECK(sample_token(logits, 1.0, 2, 0.999999) == 3);
  // Full softmax: the last bucket is id 2 (the least likely, sorted last).
  CHECK(sample_token(logits, 1.0, 0, 0.9999999) == 2);
  // A very low temperature is greedy in effect.
  CHECK(sample_token(logits, 1e-3, 0, 0.5) == 1);
}

TEST_CASE("generate is deterministic for a seed and stays in the vocabulary", "[models][generate]") {
  Context ctx;
  auto model = build_model(tiny(Family::GPT2));
  nn::materialize(ctx, *model, DType::f32, 5);
  SampleOptions o;
  o.n_tokens = 12;  // past seq_len = 8: the window slides
  o.top_k = 5;
  o.seed = 42;
  const std::vector<int32_t> a = generate(ctx, *model, {1, 2, 3}, o);
  const std::vector<int32_t> b = generate(ctx, *model, {1, 2, 3}, o);
  CHECK(a == b);
  REQUIRE(a.size() == 12);
  for (int32_t t : a) CHECK((t >= 0 && t < 30));
  o.seed = 43;
  o.temperature = 5.0;
  CHECK(generate(ctx, *model, {1, 2, 3}, o) != a);
  // Greedy: each token is the argmax of the logits for the sequence so far.
  o.temperature = 0;
  const std::vector<int32_t> greedy = generate(ctx, *model, {4}, o);
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  std::vector<int32_t> seq{4, greedy[0], greedy[1]};
  const Tensor lg = model->logits(g, ids(ctx, seq, 1, 3));
  const std::vector<float> last = ops::to_vector<float>(ctx, lg.select(0, 0).select(0, 2));
  int32_t best = 0;
  for (int32_t v = 1; v < 30; ++v)
    if (last[size_t(v)] > last[size_t(best)]) best = v;
  CHECK(greedy[2] == best);
  CHECK_THROWS_AS(generate(ctx, *model, {}, o), ValueError);
  CHECK_THROWS_AS(generate(ctx, *model, {30}, o), ValueError);
}

double rel_l2(Context& ctx, const Tensor& ours, const Tensor& ref) {
  const std::vector<double> a = ops::to_vector<double>(ctx, ops::cast(ctx, ops::to_host(ctx, ours), DType::f64));
  const std::vector<double> b = ops::to_vector<double>(ctx, ops::cast(ctx, ops::to_host(ctx, ref), DType::f64));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// `config` built twice: on the GPU in `dtype`, and on the CPU in f32 with exactly the GPU's
// (possibly bf16-rounded) weights; both run forward and backward on the same tokens.
struct GpuCpuRun {
  std::unique_ptr<LanguageModel> on_gpu, on_cpu;
  double gpu_loss = 0, cpu_loss = 0;
};

GpuCpuRun run_on_gpu_and_cpu(Context& gpu, Context& cpu, const ModelConfig& config, DType dtype) {
  GpuCpuRun r{build_model(config), build_model(config)};
  nn::materialize(gpu, *r.on_gpu, dtype, 31);
  const std::vector<nn::Parameter*> gp = r.on_gpu->named_parameters();
  const std::vector<nn::Parameter*> cp = r.on_cpu->named_parameters();
  for (size_t i = 0; i < gp.size(); ++i)
    cp[i]->data = ops::cast(cpu, ops::to_host(gpu, gp[i]->data), DType::f32);
  const std::vector<int32_t> idx = pattern(16, 7, 1, 30), tgt = pattern(16, 3, 5, 30);
  Graph gg(gpu), gc(cpu);
  const Tensor lg = r.on_gpu->forward(gg, ids(gpu, idx, 2, 8), ids(gpu, tgt, 2, 8));
  const Tensor lc = r.on_cpu->forward(gc, ids(cpu, idx, 2, 8), ids(cpu, tgt, 2, 8));
  r.gpu_loss = ops::item(gpu, lg);
  r.cpu_loss = ops::item(cpu, lc);
  gg.backward(lg, 1.0);
  gc.backward(lc, 1.0);
  return r;
}

TEST_CASE("tiny models on CUDA match the CPU reference", "[models][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu;
  Context gpu(Device::cuda(0));
  // f32 on CUDA must be true f32 (no TF32): summation order alone differs, ~1e-6. bf16 rounds
  // every activation to 8 significant bits; through two blocks that is ~1e-2 of a gradient.
  struct Precision {
    DType dtype;
    double tolerance;
  };
  for (Family f : {Family::GPT2, Family::Llama}) {
    for (const Precision& p : {Precision{DType::f32, 1e-4}, Precision{DType::bf16, 3e-2}}) {
      // The residual stream in f32 (model.fp32_residual_connection) and in the compute dtype.
      for (bool fp32_residual : {true, false}) {
        INFO(family_name(f) << " " << dtype_name(p.dtype) << " fp32 residual " << fp32_residual);
        ModelConfig config = tiny(f);
        config.fp32_residual_connection = fp32_residual;
        const GpuCpuRun r = run_on_gpu_and_cpu(gpu, cpu, config, p.dtype);
        CHECK(r.gpu_loss == Approx(r.cpu_loss).epsilon(p.tolerance));
        const std::vector<nn::Parameter*> gp = r.on_gpu->named_parameters();
        const std::vector<nn::Parameter*> cp = r.on_cpu->named_parameters();
        for (size_t i = 0; i < gp.size(); ++i) {
          INFO(gp[i]->name());
          CHECK(rel_l2(gpu, gp[i]->grad, cp[i]->grad) <= p.tolerance);
        }
      }
    }
  }
}

TEST_CASE("MoE layers: where the frequency says, named and counted as documented", "[models][moe]") {
  for (Family f : {Family::GPT2, Family::Llama}) {
    INFO(family_name(f));
    const ModelConfig c = tiny_moe(f).resolved();
    CHECK(c.is_moe_layer(0));
    CHECK_FALSE(c.is_moe_layer(1));
    CHECK(c.is_moe_layer(2));
    CHECK(c.num_moe_layers() == 2);
    auto model = build_model(c);
    CHECK(model->moe_layers().size() == 2);
    const std::string p = f == Family::GPT2 ? "h." : "layers.";
    const bool llama = f == Family::Llama;
    CHECK(model->find_parameter(p + "0.mlp.router.weight")->shape() == Shape{4, 16});
    CHECK(model->find_parameter(p + "0.mlp.experts." + (llama ? "gate_up" : "fc"))->shape() ==
          Shape{4, llama ? 12 : 6, 16});
    CHECK(model->find_parameter(p + "2.mlp.experts.proj")->shape() == Shape{4, 16, 6});
    CHECK(model->find_parameter(p + "2.mlp.shared_expert.proj.weight")->shape() == Shape{16, 5});
    CHECK(model->find_parameter(p + "1.mlp.proj.weight") != nullptr);  // dense layer 1
    CHECK(model->find_parameter(p + "1.mlp.router.weight") == nullptr);
    // The estimate's MoE term is exact: what the experts add over the dense model.
    ModelConfig dense = c;
    dense.num_moe_experts = 0;
    CHECK(double(model->num_parameters() - build_model(dense)->num_parameters()) ==
          c.parameter_estimate() - dense.parameter_estimate());
    // A token uses k = 2 of the 4 experts in each of the 2 MoE layers.
    CHECK(c.inactive_parameters_per_token() == 2.0 * 2 * (llama ? 3 : 2) * 16 * 6);
    // It trains: a loss near ln(vocab), finite gradients for the router and experts.
    Context ctx;
    nn::materialize(ctx, *model, DType::f64, 5);
    Graph g(ctx);
    const Tensor loss = model->forward(g, ids(ctx, pattern(16, 7, 1, 30), 2, 8),
                                       ids(ctx, pattern(16, 3, 5, 30), 2, 8));
    CHECK(ops::item(ctx, loss) == Approx(std::log(30.0)).epsilon(0.05));
    g.backward(loss, 1.0);
    CHECK(ops::item(ctx, ops::max_abs(ctx, model->find_parameter(p + "0.mlp.router.weight")->grad)) > 0);
  }
}

TEST_CASE("activation recompute changes no MoE loss, gradient or statistic (bitwise)",
          "[models][moe][recompute]") {
  Context ctx;
  for (Family f : {Family::GPT2, Family::Llama}) {
    ModelConfig c = tiny_moe(f);
    c.moe_aux_loss_coeff = 0.1;
    c.moe_z_loss_coeff = 0.01;
    std::vector<std::vector<float>> reference;
    std::vector<double> reference_stats;
    for (const char* mode : {"none", "full", "selective"}) {
      INFO(family_name(f) << " " << mode);
      auto model = build_model(c);
      nn::materialize(ctx, *model, DType::f32, 21);
      set_activation_recompute(*model, recompute_from_name(mode));
      Graph g(ctx);
      const Tensor loss = model->forward(g, ids(ctx, pattern(16, 7, 1, 30), 2, 8),
                                         ids(ctx, pattern(16, 3, 5, 30), 2, 8));
      g.backward(loss, 1.0);
      std::vector<std::vector<float>> gr;
      for (nn::Parameter* p : model->named_parameters())
        gr.push_back(ops::to_vector<float>(ctx, p->grad));
      // Each layer counted its one forward once, also when backward re-ran it.
      std::vector<double> stats;
      for (nn::MoELayer* l : model->moe_layers()) {
        CHECK(l->stats().forwards == 1);
        for (double v : l->stats().loss_values(ctx)) stats.push_back(v);
      }
      if (std::string(mode) == "none") {
        reference = gr;
        reference_stats = stats;
      } else {
        CHECK(gr == reference);
        CHECK(stats == reference_stats);
      }
    }
  }
}

TEST_CASE("tiny MoE models on CUDA match the CPU reference", "[models][moe][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu;
  Context gpu(Device::cuda(0));
  for (Family f : {Family::GPT2, Family::Llama}) {
    // f32: the same routing on both (the gaps between scores are far above f32 rounding), so
    // only summation order differs. bf16 rounds the router's logits to 8 bits, which can move
    // a token to another expert: there the loss is compared, and the gradients are finite.
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO(family_name(f) << " " << dtype_name(dtype));
      ModelConfig config = tiny_moe(f);
      config.moe_aux_loss_coeff = 0.1;
      config.moe_z_loss_coeff = 0.01;
      if (f == Family::GPT2) {
        config.moe_router_score_function = "sigmoid";
        config.moe_router_enable_expert_bias = true;
        config.moe_router_load_balancing_type = "seq_aux_loss";
      }
      const GpuCpuRun r = run_on_gpu_and_cpu(gpu, cpu, config, dtype);
      const double tolerance = dtype == DType::f32 ? 1e-4 : 3e-2;
      CHECK(r.gpu_loss == Approx(r.cpu_loss).epsilon(tolerance));
      const std::vector<nn::Parameter*> gp = r.on_gpu->named_parameters();
      const std::vector<nn::Parameter*> cp = r.on_cpu->named_parameters();
      const std::vector<nn::MoELayer*> mg = r.on_gpu->moe_layers(), mc = r.on_cpu->moe_layers();
      for (size_t l = 0; l < mg.size(); ++l) {
        const std::vector<double> lg = mg[l]->stats().loss_values(gpu);
        const std::vector<double> lc = mc[l]->stats().loss_values(cpu);
        CHECK(lg[0] == Approx(lc[0]).epsilon(tolerance));
        CHECK(lg[1] == Approx(lc[1]).epsilon(tolerance));
        if (dtype == DType::f32) CHECK(mg[l]->stats().counts == mc[l]->stats().counts);
      }
      for (size_t i = 0; i < gp.size(); ++i) {
        INFO(gp[i]->name());
        if (dtype == DType::f32)
          CHECK(rel_l2(gpu, gp[i]->grad, cp[i]->grad) <= 1e-4);
        else
          CHECK(std::isfinite(ops::item(gpu, ops::max_abs(gpu, gp[i]->grad))));
      }
    }
  }
}

TEST_CASE("MoE configs refuse inconsistent values by key", "[models][moe]") {
  auto error = [](ModelConfig c) -> std::string {
    try {
      c.resolved();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig c = tiny_moe(Family::Llama);
  c.moe_router_topk = 5;
  CHECK_THAT(error(c), Catch::Contains("model.moe_router_topk"));
  c = tiny_moe(Family::Llama);
  c.moe_router_score_function = "relu";
  CHECK_THAT(error(c), Catch::Contains("model.moe_router_score_function"));
  c = tiny_moe(Family::Llama);
  c.moe_router_load_balancing_type = "sinkhorn";
  CHECK_THAT(error(c), Catch::Contains("model.moe_router_load_balancing_type"));
  c = tiny_moe(Family::Llama);
  c.moe_first_k_dense_replace = 3;
  CHECK_THAT(error(c), Catch::Contains("no layer is an MoE layer"));
  c = tiny_moe(Family::Llama);
  c.moe_layer_freq = 0;
  CHECK_THAT(error(c), Catch::Contains("model.moe_layer_freq"));
  c = tiny_moe(Family::Llama);
  c.moe_ffn_hidden_size = 0;  // defaults to d_ff
  CHECK(c.resolved().moe_ffn_hidden_size == c.resolved().d_ff);
}

TEST_CASE("absurd model sizes are refused by name before anything is built", "[models]") {
  struct Case {
    const char* what;
    void (*set)(ModelConfig&);
    const char* key;
  };
  const Case cases[] = {
      {"a billion layers", [](ModelConfig& c) { c.n_layer = 1000000000; }, "model.n_layer"},
      {"a vocabulary that overflows its padding", [](ModelConfig& c) { c.vocab_size = 2147483647; },
       "model.vocab_size"},
      {"a huge width", [](ModelConfig& c) { c.d_model = int64_t(1) << 40; }, "model.d_model"},
      {"a thousand wide layers (about 10^14 parameters)",
       [](ModelConfig& c) {
         c.n_layer = 5000;
         c.d_model = 65536;
         c.n_head = 64;
         c.n_kv_head = 64;
       },
       "parameters"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    ModelConfig c = gpt2_config(12);
    k.set(c);
    CHECK_THROWS_WITH(c.resolved(), Catch::Matchers::Contains(k.key));
  }
  // The estimate agrees with the built model where both exist.
  for (const ModelConfig& c : {gpt2_config(12), llama_small_config()}) {
    const double built = double(count_parameters(c));
    CHECK(c.resolved().parameter_estimate() == Approx(built).epsilon(0.002));
  }
}

}  // namespace
}  // namespace fsdp::models
