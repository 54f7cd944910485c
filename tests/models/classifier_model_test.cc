// The models' loss path runs the head and the loss as one chunked op (nn::classifier_loss);
// the logits path (forward with `logits`) runs linear + cross_entropy. Both must give the
// same loss and the same gradient for every parameter (the tied embedding's included), for
// any chunk size and recompute mode.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/nn/init.h"
#include "tests/models/tiny_configs.h"
#include "tests/test_support.h"

namespace fsdp::models {
namespace {

// tiny(), with a vocabulary of 29 (so 3 padded rows) and sequences of 7.
ModelConfig small(Family family, bool tied, int64_t chunk_rows) {
  ModelConfig c = tiny(family);
  c.vocab_size = 29;
  c.seq_len = 7;
  c.tie_embeddings = tied;
  c.classifier_chunk_rows = chunk_rows;
  return c;
}

struct Step {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter, in named_parameters() order
  size_t nodes = 0;                       // tape length before backward
};

Step step(Context& ctx, LanguageModel& model, const Tensor& idx, const Tensor& targets,
          bool logits_path) {
  for (nn::Parameter* p : model.named_parameters()) p->grad = Tensor();
  Graph g(ctx);
  Tensor logits;
  const Tensor loss = model.forward(g, idx, targets, -1, logits_path ? &logits : nullptr);
  CHECK(logits.defined() == logits_path);
  Step s;
  s.loss = ops::item(ctx, loss);
  s.nodes = g.num_nodes();
  g.backward(loss);
  for (nn::Parameter* p : model.named_parameters())
    s.grads.push_back(ops::to_vector<float>(ctx, p->grad));
  return s;
}

TEST_CASE("the chunked classifier gives the logits path's loss and gradients", "[models]") {
  Context ctx;
  const int64_t B = 3, T = 7;  // 21 tokens
  std::vector<int32_t> in, out;
  for (int64_t i = 0; i < B * T; ++i) {
    in.push_back(int32_t((i * 7 + 3) % 29));
    out.push_back(i % 6 == 4 ? -1 : int32_t((i * 11 + 5) % 29));
  }
  const Tensor idx = ops::from_host<int32_t>(ctx, in, Shape{B, T});
  const Tensor targets = ops::from_host<int32_t>(ctx, out, Shape{B, T});
  struct Variant {
    Family family;
    bool tied;
  };
  for (Variant v : {Variant{Family::GPT2, true}, Variant{Family::Llama, false},
                    Variant{Family::Llama, true}}) {
    for (int64_t chunk : {int64_t(0), int64_t(4), int64_t(21), int64_t(8192)}) {
      for (const char* recompute : {"none", "full"}) {
        INFO(family_name(v.family) << (v.tied ? " tied" : " untied") << " chunk_rows " << chunk
                                   << " recompute " << recompute);
        auto model = build_model(small(v.family, v.tied, chunk));
        nn::materialize(ctx, *model, DType::f32, 77);
        set_activation_recompute(*model, recompute_from_name(recompute));
        const Step want = step(ctx, *model, idx, targets, true);
        const Step got = step(ctx, *model, idx, targets, false);
        // One node fewer: the head and the loss are one op.
        CHECK(got.nodes + 1 == want.nodes);
        CHECK(got.loss == Approx(want.loss).epsilon(1e-6));
        const std::vector<nn::Parameter*> params = model->named_parameters();
        REQUIRE(got.grads.size() == want.grads.size());
        for (size_t i = 0; i < params.size(); ++i) {
          INFO(params[i]->name());
          const std::vector<float>& a = got.grads[i];
          const std::vector<float>& b = want.grads[i];
          REQUIRE(a.size() == b.size());
          double worst = 0, scale = 0;
          for (size_t k = 0; k < a.size(); ++k) {
            worst = std::max(worst, std::fabs(double(a[k]) - double(b[k])));
            scale = std::max(scale, std::fabs(double(b[k])));
          }
          CHECK(scale > 0);
          CHECK(worst <= 1e-5 * scale);
        }
      }
    }
  }
}

double rel_l2(Context& ctx, const Tensor& ours, const Tensor& ref) {
  const std::vector<double> a =
      ops::to_vector<double>(ctx, ops::cast(ctx, ops::to_host(ctx, ours), DType::f64));
  const std::vector<double> b =
      ops::to_vector<double>(ctx, ops::cast(ctx, ops::to_host(ctx, ref), DType::f64));
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// The chunked classifier on CUDA (4 rows per chunk of 21 tokens) against the CPU's logits
// path on the same (rounded) weights: the tolerances of the CUDA-vs-CPU model test
// (models_test.cc): f32 summation order ~1e-6; bf16 activations through two blocks ~1e-2.
TEST_CASE("CUDA chunked classifier matches the CPU's logits path", "[models][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t B = 3, T = 7;
  std::vector<int32_t> in, out;
  for (int64_t i = 0; i < B * T; ++i) {
    in.push_back(int32_t((i * 5 + 1) % 29));
    out.push_back(i % 5 == 3 ? -1 : int32_t((i * 13 + 2) % 29));
  }
  for (Family f : {Family::GPT2, Family::Llama}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO(family_name(f) << " " << dtype_name(dt));
      const double tol = dt == DType::f32 ? 1e-4 : 3e-2;
      const ModelConfig config = small(f, f == Family::GPT2, 4);
      auto on_gpu = build_model(config);
      auto on_cpu = build_model(config);
      nn::materialize(gpu, *on_gpu, dt, 91);
      const std::vector<nn::Parameter*> gp = on_gpu->named_parameters();
      const std::vector<nn::Parameter*> cp = on_cpu->named_parameters();
      for (size_t i = 0; i < gp.size(); ++i)
        cp[i]->data = ops::cast(cpu, ops::to_host(gpu, gp[i]->data), DType::f32);
      const Step want = step(cpu, *on_cpu, ops::from_host<int32_t>(cpu, in, Shape{B, T}),
                             ops::from_host<int32_t>(cpu, out, Shape{B, T}), true);
      Graph g(gpu);
      const Tensor loss = on_gpu->forward(g, ops::from_host<int32_t>(gpu, in, Shape{B, T}),
                                          ops::from_host<int32_t>(gpu, out, Shape{B, T}));
      CHECK(ops::item(gpu, loss) == Approx(want.loss).epsilon(tol));
      g.backward(loss, 1.0);
      for (size_t i = 0; i < gp.size(); ++i) {
        INFO(gp[i]->name());
        CHECK(rel_l2(gpu, gp[i]->grad, cp[i]->grad) <= tol);
      }
    }
  }
}

TEST_CASE("model.classifier_chunk_rows must not be negative", "[models]") {
  ModelConfig c = small(Family::GPT2, true, -1);
  CHECK_THROWS_AS(c.resolved(), ConfigError);
  c.classifier_chunk_rows = 0;
  CHECK(c.resolved().classifier_chunk_rows == 0);
  CHECK(ModelConfig().classifier_chunk_rows == kDefaultClassifierChunkRows);
}

}  // namespace
}  // namespace fsdp::models
