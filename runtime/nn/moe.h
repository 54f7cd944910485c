// A mixture-of-experts layer (dropless, token-choice top-k), usable wherever the dense MLP
// is: a router Linear (C -> E, no bias) picks k experts per token, the tokens are grouped by
// expert, each expert's MLP runs on its rows (one grouped matmul per projection), and the
// results are combined with the routing weights; an optional shared expert (an ordinary
// dense MLP) is added to every token's output.
//
// Parameter names under the layer (e.g. layers.<i>.mlp):
//   router.weight                   (E, C)
//   experts.gate_up                 (E, 2F, C) = [gate; up] per expert   (SwiGLU experts)
//   experts.fc                      (E, F, C)                            (GELU experts)
//   experts.proj                    (E, C, F)
//   shared_expert.{gate_up,fc,proj}.weight   the dense MLP's names, when it exists
// Hugging Face Mixtral / Qwen3-MoE keep experts.<e>.{gate_proj,up_proj,down_proj}.weight
// (w1, w3, w2 in Mixtral): gate_up[e, :F] = gate_proj, gate_up[e, F:] = up_proj,
// proj[e] = down_proj, router.weight = gate.weight; shared_expert matches Qwen2-MoE's.
//
// Auxiliary losses. The load-balancing loss and the z-loss (moe_losses.h) are part of the
// training objective: the layer's backward adds their gradients (times their coefficients)
// as if `coeff * loss` had been added to a loss whose backward is seeded with 1, which is
// how the trainer runs each micro-batch's backward (its LM loss is seeded with 1 and the
// gradients are scaled by 1 / (micro-batches x data-parallel ranks) afterwards, so the
// auxiliary terms scale exactly as the LM loss does). Their values are not part of the
// returned tensor: the layer adds them, unscaled, into its MoeStats for reporting, on the
// device (the step reads them once).
#pragma once

#include <functional>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/nn/expert_parallel.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe_losses.h"

namespace fsdp::nn {

struct MoeOptions {
  int64_t experts = 0;  // E
  int64_t top_k = 1;    // k
  int64_t hidden = 0;   // F, each expert's hidden size
  ops::RouterScore score = ops::RouterScore::Softmax;
  bool normalize = true;  // divide the k chosen weights by their sum
  MoeBalancing balancing = MoeBalancing::AuxLoss;
  double aux_loss_coeff = 0;
  double z_loss_coeff = 0;
  // A per-expert bias (f32, not a gradient parameter) added to the scores only to choose the
  // experts (auxiliary-loss-free balancing); the trainer moves it after each optimizer step.
  bool expert_bias = false;
};

// What a layer's forwards measured since the last reset().
struct MoeStats {
  int64_t forwards = 0;
  std::vector<double> counts;  // (E) token-expert assignments, summed over the forwards
  // (2) on the device: the unscaled balancing loss and z-loss, summed over the forwards
  // (undefined until the first forward that computes one).
  Tensor losses;
  void reset() {
    forwards = 0;
    counts.assign(counts.size(), 0.0);
    losses = Tensor();
  }
  // Adds a forward's losses (() tensors or undefined; MoeLosses::aux and z).
  void add_losses(Context& ctx, const Tensor& aux, const Tensor& z);
  // {balancing loss, z-loss} summed over the forwards (waits for the device).
  std::vector<double> loss_values(Context& ctx) const;
};

// The routed experts as one differentiable op: x (..., C) -> (..., C). Experts are
// SwiGLU (fc = gate_up (E, 2F, C)) or GELU (fc (E, F, C)); proj (E, C, F); no biases.
// expert_bias (E) f32 or undefined. Adds to `stats` (when given) unless the graph is
// re-running a forward for activation recompute. The leading dimensions of x are its
// sequences (for seq_aux_loss): x.size(0) for (B, T, C).
//
// The groups a plan from outside splits the layer's work over: the expert-parallel ranks
// (each holding E / ep of the experts, fc and proj their slices), and the ranks that split
// every sequence with this one (context parallelism, and tensor parallelism's sequence
// split; MoeLossOptions).
//
// `beside_dispatch`, when given, runs while the rows travel to their experts' ranks (under
// expert parallelism on GPUs the exchange runs beside it; elsewhere the rows have arrived):
// the layer computes its shared expert there when asked to (MoELayer::set_shared_expert_overlap).
// It runs at that point with or without expert parallelism, so every layout records the same
// tape.
struct MoeGroups {
  ExpertParallelGroup* experts = nullptr;
  ParallelGroup* context = nullptr;
  ParallelGroup* sequence = nullptr;
};
Tensor moe(Graph& g, const Tensor& x, Parameter& router, Parameter& fc, Parameter& proj,
           MlpActivation activation, const MoeOptions& options, const Tensor& expert_bias,
           MoeStats* stats, bool recompute_activation = false, const MoeGroups& groups = {},
           const std::function<void()>& beside_dispatch = {});

// The expert weights of one layer, as one module so that they are named experts.*.
class ExpertWeights : public Module {
 public:
  ExpertWeights(int64_t experts, int64_t dim, int64_t hidden, MlpActivation activation,
                InitRule init, InitRule proj_init);
  std::string kind() const override { return "experts"; }
  Parameter& fc() { return *fc_; }
  Parameter& proj() { return *proj_; }

 private:
  Parameter* fc_;
  Parameter* proj_;
};

// The MoE layer, of kind "moe". It is an nn::MLP: selective recompute recomputes the
// experts' activation in backward.
class MoELayer : public MLP {
 public:
  std::string kind() const override { return "moe"; }
  // `shared_hidden` > 0 adds a shared expert of that hidden size.
  MoELayer(int64_t dim, const MoeOptions& options, int64_t shared_hidden,
           MlpActivation activation, InitRule init, InitRule proj_init);
  const MoeOptions& options() const { return options_; }
  Linear router;
  ExpertWeights experts;
  std::unique_ptr<MLP> shared_expert;  // null without one

  // The selection bias (E) f32 on the weights' device, created zero on first use when
  // options().expert_bias; undefined otherwise.
  Tensor& expert_bias() { return expert_bias_; }
  MoeStats& stats() { return stats_; }
  // bias_e += rate * sign(mean count - count_e) for the given counts (E): raises the bias of
  // the experts that got fewer tokens than the mean. No-op without an expert bias.
  void update_expert_bias(Context& ctx, const std::vector<double>& counts, double rate);
  // Expert parallelism (set by a plan from outside, with the experts' weights sliced to this
  // rank's E / ep): the layer exchanges its rows with the group. Null: none.
  void set_expert_parallel(ExpertParallelGroup* group) { groups_.experts = group; }
  ExpertParallelGroup* expert_parallel() const { return groups_.experts; }
  // The shared expert computed while the routed rows travel to their experts (moe()'s
  // beside_dispatch; Megatron's moe_shared_expert_overlap), instead of after the routed
  // experts. Its input gradient then sums in another order: set it alike in runs compared
  // bit for bit.
  void set_shared_expert_overlap(bool on) { shared_expert_overlap_ = on; }
  bool shared_expert_overlap() const { return shared_expert_overlap_; }
  // Context parallelism, and tensor parallelism with its sequence split (set by their
  // plans): this rank holds a part of every sequence, and the balancing loss counts the
  // choices of every part. Null: none. Under tensor parallelism the router and the experts
  // are whole on every rank, each running its own T / tp tokens (their gradients are summed
  // over the group), and the shared expert is split as a dense MLP is.
  void set_context_parallel(ParallelGroup* group) { groups_.context = group; }
  void set_sequence_parallel(ParallelGroup* group) { groups_.sequence = group; }

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;

 private:
  MoeOptions options_;
  MlpActivation activation_;
  Tensor expert_bias_;
  MoeStats stats_;
  MoeGroups groups_;
  bool shared_expert_overlap_ = false;
};

}  // namespace fsdp::nn
