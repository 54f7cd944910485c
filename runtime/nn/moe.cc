// The mixture-of-experts layer: the routed experts as one differentiable op (nn::moe), and
// the module around it (MoELayer). One node for the whole routed path keeps the many
// intermediate index tensors out of the tape and lets backward reuse the forward's host
// copy of the expert counts.
#include "runtime/nn/moe.h"

#include <cmath>
#include <optional>

#include "kernels/ops.h"
#include "runtime/nn/dense_product.h"
#include "runtime/nn/expert_parallel.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

using detail::rows;

namespace {

// The routed path's input gradient: dx (N, C) (+)= the sum of each token's k rows of dxs
// (R, C), + dlogits (N, E) @ W_router (E, C). dest (N, k): the row of each (token, expert).
void write_input_grad(Graph& g, const autograd::GradTarget& tx, const Tensor& dxs,
                      const Tensor& dlogits, const Tensor& dest, const Parameter& router) {
  Context& ctx = g.ctx();
  const autograd::GradSink sx = g.grad_sink(tx);
  if (!sx.defined()) return;
  const int64_t N = dlogits.size(0), C = router.shape()[1];
  const Tensor dx = sx.buffer.view(Shape{N, C});
  ops::moe_permute_backward(ctx, dx, dxs, dest, sx.accumulate);
  detail::input_product(ctx, dx, dlogits, std::nullopt, router, 1.0);  // in bf16
}

// With the shared expert beside the dispatch, its backward runs while the inputs' gradients
// travel home: the routed op's backward leaves them here (on their way under expert
// parallelism) and a node recorded before the shared expert's, so run after it, writes them.
struct InputGradOnItsWay {
  std::optional<PendingRows> rows;  // dxs coming home (expert parallelism)
  Tensor dxs, dlogits;              // dxs when it is here already
};

}  // namespace

// (Over 80 lines on purpose: an op's forward and the backward closure it records are one
// function, so the tensors the forward saves and the backward reads stay in one view.)
Tensor moe(Graph& g, const Tensor& x, Parameter& router, Parameter& fc, Parameter& proj,
           MlpActivation activation, const MoeOptions& o, const Tensor& expert_bias,
           MoeStats* stats, bool recompute_activation, const MoeGroups& groups,
           const std::function<void()>& beside_dispatch) {
  Context& ctx = g.ctx();
  ExpertParallelGroup* ep = groups.experts;
  const Tensor& w_router = router.checked_data();  // (E, C)
  const Tensor& w_fc = fc.checked_data();          // (E, F or 2F, C)
  const Tensor& w_proj = proj.checked_data();      // (E, C, F)
  const int64_t E = w_router.size(0), C = w_router.size(1), k = o.top_k;
  const int64_t h_f = w_fc.size(1), f = w_proj.size(2);
  const bool gelu = activation == MlpActivation::Gelu;
  // Under expert parallelism this rank holds E / ep of the experts (ExpertParallelLayout).
  const ExpertParallelLayout layout =
      ExpertParallelLayout::make(E, ep ? ep->size() : 1, ep ? ep->rank() : 0);
  const int64_t E_local = layout.local_experts();
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == C, ShapeError, "moe ", router.name(), ": input ",
             x.str(), " does not end in ", C, " features");
  FSDP_CHECK(w_fc.dim() == 3 && w_proj.dim() == 3 && w_fc.size(0) == E_local &&
                 w_proj.size(0) == E_local &&
                 w_fc.size(2) == C && w_proj.size(1) == C && h_f == (gelu ? f : 2 * f),
             ShapeError, "moe: ", fc.name(), " ", w_fc.str(), " and ", proj.name(), " ",
             w_proj.str(), " are not the ", gelu ? "GELU" : "SwiGLU", " experts of ",
             router.name(), " ", w_router.str());
  FSDP_CHECK(k >= 1 && k <= E, ConfigError, "moe ", router.name(), ": top_k ", k,
             " must be in [1, ", E, "]");
  detail::check_compute_dtype(x, router, "moe");
  const DType cd = w_fc.dtype(), sd = stat_dtype(cd);
  const Tensor x2 = rows(ctx, x, C);  // (N, C)
  const int64_t N = x2.size(0), R = N * k;
  FSDP_CHECK(N > 0, ShapeError, "moe ", router.name(), ": no tokens in ", x.str());

  // Routing: logits (N, E) -> the k experts of each token and their weights.
  Tensor logits = ctx.empty(Shape{N, E}, cd);
  detail::product(ctx, logits, x2, router, false, Tensor(), ops::Epilogue::None, Tensor(),
                  false);  // the router is never FP8
  const Tensor indices = ctx.empty(Shape{N, k}, DType::i32);  // (N, k)
  const Tensor weights = ctx.empty(Shape{N, k}, sd);          // (N, k)
  const Tensor scores = ctx.empty(Shape{N, E}, sd);           // (N, E)
  ops::RouterOptions ro;
  ro.score = o.score;
  ro.top_k = k;
  ro.normalize = o.normalize;
  ops::moe_router_forward(ctx, indices, weights, scores, logits, ro, expert_bias);

  // Dropless dispatch: every (token, expert) pair becomes one row of its expert's group.
  const Tensor counts_dev = ctx.empty(Shape{E}, DType::i32);  // (E)
  const Tensor source = ctx.empty(Shape{R}, DType::i32);      // (R) token of each sorted row
  const Tensor dest = ctx.empty(Shape{N, k}, DType::i32);     // (N, k) row of each pair
  ops::moe_sort_by_expert(ctx, counts_dev, source, dest, indices);
  std::vector<int64_t> counts;  // on the host: the grouped matmuls split their rows by it
  for (int32_t c : ops::to_vector<int32_t>(ctx, counts_dev)) counts.push_back(c);

  const Tensor xs = ctx.empty(Shape{R, C}, cd);  // (R, C) the rows, grouped by expert
  ops::moe_permute(ctx, xs, x2, source);
  // Expert parallelism: the rows go to the ranks that hold their experts and come back
  // after the experts ran (xe, ye: (R', C), this rank's experts' rows from every rank).
  std::shared_ptr<const ExpertExchange> exchange;
  std::vector<int64_t> local_counts = counts;  // (E_local) rows of each expert held here
  // The node that writes the input gradient after the shared expert's backward, recorded
  // before the shared expert runs.
  std::shared_ptr<InputGradOnItsWay> on_its_way;
  if (beside_dispatch && g.should_record({&x}, true)) {
    on_its_way = std::make_shared<InputGradOnItsWay>();
    g.record("moe_input_grad:" + router.name(), {},
             [on_its_way, tx = Graph::target(x), dest, &router](Graph& g) {
               InputGradOnItsWay& w = *on_its_way;
               if (!w.dlogits.defined()) return;  // the routed op's backward did not run
               const Tensor dxs = w.rows ? w.rows->finish(g.ctx()) : w.dxs;
               w.rows.reset();
               write_input_grad(g, tx, dxs, w.dlogits, dest, router);
               w.dxs = w.dlogits = Tensor();
             });
  }
  std::optional<PendingRows> dispatch;
  if (ep) {
    exchange = plan_expert_exchange(ctx, counts, layout, *ep);
    local_counts = exchange->regroup.expert_counts;
    dispatch.emplace(PendingRows::to_experts(ctx, *ep, *exchange, xs));
  }
  if (beside_dispatch) beside_dispatch();
  const Tensor xe = dispatch ? dispatch->finish(ctx) : xs;
  const int64_t Re = xe.size(0);
  const Tensor h = ctx.empty(Shape{Re, h_f}, cd);  // (R', F or 2F) the activation's input
  ops::moe_grouped_matmul(ctx, h, xe, w_fc, local_counts);
  Tensor a = ctx.empty(Shape{Re, f}, cd);  // (R', F)
  detail::mlp_activation(ctx, activation, a, h);
  Tensor ys = ctx.empty(Shape{Re, C}, cd);  // (R', C) each row's expert output
  ops::moe_grouped_matmul(ctx, ys, a, w_proj, local_counts);
  // Expert parallelism: the outputs go home while the auxiliary losses are computed.
  std::optional<PendingRows> combine;
  if (ep) combine.emplace(PendingRows::from_experts(ctx, *ep, *exchange, ys));

  // The auxiliary losses and their gradients, on the device.
  MoeLossOptions lo;
  lo.sequences = x.dim() == 3 ? x.size(0) : 1;
  lo.sigmoid = o.score == ops::RouterScore::Sigmoid;
  lo.balancing = o.balancing;
  lo.aux_coeff = o.aux_loss_coeff;
  lo.z_coeff = o.z_loss_coeff;
  lo.context_group = groups.context;
  lo.sequence_group = groups.sequence;
  const MoeLosses losses = moe_losses(ctx, scores, logits, indices, lo);

  if (combine) ys = combine->finish(ctx);  // (R, C)
  Tensor y = ctx.empty(x.shape(), cd);  // (..., C)
  ops::moe_unpermute(ctx, y.view(Shape{N, C}), ys, weights, dest);
  if (stats && !g.recomputing()) {
    stats->forwards++;
    stats->add_losses(ctx, losses.aux, losses.z);
    stats->counts.resize(size_t(E), 0.0);
    for (int64_t e = 0; e < E; ++e) stats->counts[size_t(e)] += double(counts[size_t(e)]);
  }
  if (!g.should_record({&x}, true)) return y;

  // The losses' gradients, ready for backward (the coefficients are in them).
  const Tensor dscores = losses.dscores, dlogits_z = losses.dlogits;
  y = Graph::track(y);
  const Tensor saved_a = recompute_activation ? Tensor() : a;
  a = Tensor();
  g.record("moe:" + router.name(), {y.autograd_meta()},
           [tx = Graph::target(x), ym = y.autograd_meta(), x2, indices, weights, scores, dest,
            local_counts, xe, h, saved_a, ys, dscores, dlogits_z, &router, &fc, &proj, activation,
            ro, N, C, E, R, Re, h_f, f, ep, exchange, on_its_way](Graph& g) {
             Context& ctx = g.ctx();
             const DType cd = xe.dtype(), sd = weights.dtype();
             // The auxiliary losses send gradients even where the output gets none.
             Tensor dy = Graph::grad_of(ym);
             dy = dy.defined() ? rows(ctx, dy, C) : ops::zeros(ctx, Shape{N, C}, cd);  // (N, C)
             // The combine: dys (R, C) and the routing weights' gradient (N, k).
             const Tensor dys = ctx.empty(Shape{R, C}, cd);
             const Tensor dweights = ctx.empty(weights.shape(), sd);
             ops::moe_unpermute_backward(ctx, dys, dweights, dy, ys, weights, dest);
             // Expert parallelism: the rows' gradients go to their experts' ranks while the
             // activation is recomputed and the router's backward runs.
             std::optional<PendingRows> to_experts;
             if (ep) to_experts.emplace(PendingRows::to_experts(ctx, *ep, *exchange, dys));
             Tensor a = saved_a;
             if (!a.defined()) {
               a = ctx.empty(Shape{Re, f}, cd);  // (R', F), recomputed
               detail::mlp_activation(ctx, activation, a, h);
             }
             // The router: dlogits (N, E) from the weights' gradient and the balancing loss's
             // gradient of the scores, plus the z-loss's gradient of the logits.
             const Tensor dlogits = ctx.empty(Shape{N, E}, cd);
             ops::moe_router_backward(ctx, dlogits, dweights, scores, indices, ro, dscores);
             if (dlogits_z.defined()) ops::axpby(ctx, dlogits, 1.0, dlogits_z, 1.0);
             // drouter (E, C) += dlogits^T @ x
             detail::weight_product(ctx, router, nullptr, dlogits, std::nullopt,
                                    ops::Fp8Matrix(), x2);
             const Tensor dye = to_experts ? to_experts->finish(ctx) : dys;  // (R', C)
             // proj: da (R', F) = dye_e @ proj_e; dproj_e (C, F) += dye_e^T @ a_e
             const Tensor da = ctx.empty(Shape{Re, f}, cd);
             ops::moe_grouped_matmul_backward(ctx, da, proj.grad_for_accumulation(ctx), dye, a,
                                              proj.checked_data(), local_counts, true);
             a = Tensor();
             const Tensor dh = ctx.empty(Shape{Re, h_f}, cd);  // (R', F or 2F)
             if (activation == MlpActivation::Gelu)
               ops::gelu_backward(ctx, dh, da, h);
             else
               ops::swiglu_backward(ctx, dh, da, h);
             // fc: dxe (R', C) = dh_e @ fc_e; dfc_e += dh_e^T @ xe_e
             const Tensor dxe = ctx.empty(Shape{Re, C}, cd);
             ops::moe_grouped_matmul_backward(ctx, dxe, fc.grad_for_accumulation(ctx), dh, xe,
                                              fc.checked_data(), local_counts, true);
             // ... and the inputs' gradients come back to the rows' ranks (R, C): beside the
             // shared expert's backward when it ran beside the dispatch.
             if (on_its_way) {
               if (ep)
                 on_its_way->rows.emplace(PendingRows::from_experts(ctx, *ep, *exchange, dxe));
               else
                 on_its_way->dxs = dxe;
               on_its_way->dlogits = dlogits;
               return;
             }
             const Tensor dxs = ep ? rows_from_experts(ctx, *ep, *exchange, dxe) : dxe;
             write_input_grad(g, tx, dxs, dlogits, dest, router);
           });
  return y;
}

// ---------------------------------------------------------------- modules

void MoeStats::add_losses(Context& ctx, const Tensor& aux, const Tensor& z) {
  const Tensor& any = aux.defined() ? aux : z;
  if (!any.defined()) return;
  if (!losses.defined()) losses = ops::zeros(ctx, Shape{2}, any.dtype());
  if (aux.defined()) ops::axpby(ctx, losses.narrow(0, 0, 1), 1.0, aux.view(Shape{1}), 1.0);
  if (z.defined()) ops::axpby(ctx, losses.narrow(0, 1, 1), 1.0, z.view(Shape{1}), 1.0);
}

std::vector<double> MoeStats::loss_values(Context& ctx) const {
  if (!losses.defined()) return {0.0, 0.0};
  return ops::to_vector<double>(ctx, ops::cast(ctx, losses, DType::f64));
}

ExpertWeights::ExpertWeights(int64_t experts, int64_t dim, int64_t hidden,
                             MlpActivation activation, InitRule init, InitRule proj_init) {
  const bool gelu = activation == MlpActivation::Gelu;
  fc_ = &add_parameter(gelu ? "fc" : "gate_up", Shape{experts, gelu ? hidden : 2 * hidden, dim},
                       init, true);
  proj_ = &add_parameter("proj", Shape{experts, dim, hidden}, proj_init, true);
}

namespace {

std::unique_ptr<MLP> shared_mlp(int64_t dim, int64_t hidden, MlpActivation activation,
                                InitRule init, InitRule proj_init) {
  if (hidden <= 0) return nullptr;
  if (activation == MlpActivation::Gelu)
    return std::make_unique<GeluMLP>(dim, hidden, false, init, proj_init);
  return std::make_unique<SwiGLUMLP>(dim, hidden, false, init, proj_init);
}

}  // namespace

MoELayer::MoELayer(int64_t dim, const MoeOptions& options, int64_t shared_hidden,
                   MlpActivation activation, InitRule init, InitRule proj_init)
    : router(dim, options.experts, false, init),
      experts(options.experts, dim, options.hidden, activation, init, proj_init),
      shared_expert(shared_mlp(dim, shared_hidden, activation, init, proj_init)),
      options_(options),
      activation_(activation) {
  FSDP_CHECK(options.experts >= 1 && options.top_k >= 1 && options.top_k <= options.experts &&
                 options.hidden >= 1,
             ConfigError, "MoE layer: ", options.experts, " experts, top ", options.top_k,
             ", hidden ", options.hidden, " do not make a layer");
  add_module("router", router);
  add_module("experts", experts);
  if (shared_expert) add_module("shared_expert", *shared_expert);
  stats_.counts.assign(size_t(options.experts), 0.0);
}

Tensor MoELayer::compute(Graph& g, const Tensor& x) {
  if (options_.expert_bias && !expert_bias_.defined())
    expert_bias_ = ops::zeros(g.ctx(), Shape{options_.experts}, DType::f32);
  // The shared expert runs while the routed rows travel to their experts, or after them.
  Tensor shared;  // (..., C)
  std::function<void()> run_shared;
  if (shared_expert && shared_expert_overlap_) run_shared = [&] { shared = (*shared_expert)(g, x); };
  Tensor y = moe(g, x, router.weight(), experts.fc(), experts.proj(), activation_, options_,
                 expert_bias_, &stats_, recompute_activation, groups_, run_shared);  // (..., C)
  if (shared_expert && !shared.defined()) shared = (*shared_expert)(g, x);
  if (shared.defined()) y = add(g, y, shared);
  return y;
}

void MoELayer::update_expert_bias(Context& ctx, const std::vector<double>& counts, double rate) {
  if (!options_.expert_bias || !expert_bias_.defined()) return;
  FSDP_CHECK(int64_t(counts.size()) == options_.experts, ShapeError, "update_expert_bias: ",
             counts.size(), " counts for ", options_.experts, " experts");
  double mean = 0;
  for (double c : counts) mean += c / double(counts.size());
  std::vector<float> bias = ops::to_vector<float>(ctx, expert_bias_);
  for (size_t e = 0; e < bias.size(); ++e) {
    const double d = mean - counts[e];
    bias[e] += float(rate * double((d > 0) - (d < 0)));
  }
  ops::copy(ctx, expert_bias_, ops::from_host<float>(ctx, bias, expert_bias_.shape()));
}

}  // namespace fsdp::nn
