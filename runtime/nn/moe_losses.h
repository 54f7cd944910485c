// The router's auxiliary losses of a mixture-of-experts layer, on the host: the
// load-balancing loss (Switch Transformer / Megatron "aux_loss", or per sequence
// "seq_aux_loss") and the router z-loss (ST-MoE), with their gradients.
//
// They are computed from host copies of the layer's scores, logits and choices: the layer
// copies its expert counts to the host on every forward anyway (the grouped matmul needs
// them), and these (N, E) copies are small beside the activations. A device kernel can
// replace this file without changing its contract.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::nn {

enum class MoeBalancing : uint8_t {
  None,
  AuxLoss,     // over every token of the micro-batch
  SeqAuxLoss,  // per sequence, averaged over the sequences
};
const char* moe_balancing_name(MoeBalancing b);        // "none", "aux_loss", "seq_aux_loss"
MoeBalancing moe_balancing_from_name(const std::string& name);  // throws ConfigError

struct MoeLossInputs {
  int64_t tokens = 0;     // N
  int64_t experts = 0;    // E
  int64_t top_k = 0;      // k
  int64_t sequences = 1;  // the N tokens are this many sequences of N / sequences, in order
  bool sigmoid = false;   // sigmoid scores: normalized per token before the balancing loss
  MoeBalancing balancing = MoeBalancing::None;
  double aux_coeff = 0;   // the balancing loss's weight in the objective
  double z_coeff = 0;     // the z-loss's weight in the objective
  const double* scores = nullptr;   // (N, E)
  const double* logits = nullptr;   // (N, E), read only when z_coeff > 0
  const int32_t* indices = nullptr; // (N, k) the chosen experts
};

struct MoeLosses {
  // Unscaled values (without their coefficients).
  double aux = 0;  // E sum_e f_e P_e: 1 when perfectly balanced (0 when balancing is None)
  double z = 0;    // mean over tokens of logsumexp(logits)^2 (0 when z_coeff == 0)
  // Gradients of aux_coeff * aux and z_coeff * z, (N, E) each; empty when that term is off.
  std::vector<double> dscores;
  std::vector<double> dlogits;
};

MoeLosses moe_losses(const MoeLossInputs& in);

}  // namespace fsdp::nn
