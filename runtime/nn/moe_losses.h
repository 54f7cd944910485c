// The router's auxiliary losses of a mixture-of-experts layer: the load-balancing loss
// (Switch Transformer / Megatron "aux_loss", or per sequence "seq_aux_loss") and the router
// z-loss (ST-MoE), with their gradients, computed where the scores are (ops::
// moe_balancing_loss, ops::moe_z_loss): nothing is copied to the host, and their values
// stay on the device until the step reads them.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::nn {

enum class MoeBalancing : uint8_t {
  None,
  AuxLoss,     // over every token of the micro-batch
  SeqAuxLoss,  // per sequence, averaged over the sequences
};
const char* moe_balancing_name(MoeBalancing b);        // "none", "aux_loss", "seq_aux_loss"
MoeBalancing moe_balancing_from_name(const std::string& name);  // throws ConfigError

class ParallelGroup;

struct MoeLossOptions {
  int64_t sequences = 1;  // the N tokens are this many sequences of N / sequences, in order
  bool sigmoid = false;   // sigmoid scores: normalized per token before the balancing loss
  MoeBalancing balancing = MoeBalancing::None;
  double aux_coeff = 0;   // the balancing loss's weight in the objective
  double z_coeff = 0;     // the z-loss's weight in the objective (0: not computed)
  // The ranks that split every sequence with this one, or null: the context-parallel ranks
  // (each holding 2 of its 2 cp chunks), and under sequence parallelism the
  // tensor-parallel ones (each holding T / tp of the rank's tokens). The balancing loss is
  // then the loss of the whole sequences: their choices are summed over both groups first.
  // Each rank's terms are weighted as its gradients are reduced: the data- and
  // context-parallel reduction averages (every rank's LM loss is its tokens' mean), the
  // tensor-parallel one sums (the layer's weights see only the rank's tokens). So the
  // balancing loss's terms count cp times the rank's part of the whole loss, and the
  // z-loss's, a mean over the rank's tokens (cp times its part already), 1 / tp of it. The
  // reported values count as every rank's do, summed over all ranks and divided by them.
  ParallelGroup* context_group = nullptr;
  ParallelGroup* sequence_group = nullptr;
};

// On the device, without waiting for it: the values are () tensors of the scores' dtype,
// undefined when their term is off.
struct MoeLosses {
  // Unscaled values (without their coefficients).
  Tensor aux;  // E sum_e f_e P_e (per sequence and averaged for seq_aux_loss): 1 when balanced
  Tensor z;    // mean over tokens of logsumexp(logits)^2
  // Gradients of aux_coeff * aux (N, E) (the scores' dtype) and of z_coeff * z (N, E) (the
  // logits' dtype).
  Tensor dscores, dlogits;
};

// scores (N, E) and indices (N, k) from ops::moe_router_forward, logits (N, E) its input.
MoeLosses moe_losses(Context& ctx, const Tensor& scores, const Tensor& logits,
                     const Tensor& indices, const MoeLossOptions& options);

}  // namespace fsdp::nn
