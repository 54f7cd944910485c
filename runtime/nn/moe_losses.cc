#include "runtime/nn/moe_losses.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"

namespace fsdp::nn {

const char* moe_balancing_name(MoeBalancing b) {
  switch (b) {
    case MoeBalancing::None: return "none";
    case MoeBalancing::AuxLoss: return "aux_loss";
    case MoeBalancing::SeqAuxLoss: return "seq_aux_loss";
  }
  return "?";
}

MoeBalancing moe_balancing_from_name(const std::string& name) {
  if (name == "none") return MoeBalancing::None;
  if (name == "aux_loss") return MoeBalancing::AuxLoss;
  if (name == "seq_aux_loss") return MoeBalancing::SeqAuxLoss;
  FSDP_THROW(ConfigError, "model.moe_router_load_balancing_type '", name,
             "' is not one of: aux_loss, seq_aux_loss, none");
}

namespace {

// The balancing loss of tokens [begin, end), E sum_e f_e P_e with f_e the fraction of the
// group's (end - begin) k choices that went to e and P_e the group's mean (normalized)
// score of e; adds `weight` times its gradient with respect to the scores into dscores.
double balancing_group(const MoeLossInputs& in, int64_t begin, int64_t end, double weight,
                       std::vector<double>& dscores) {
  const int64_t E = in.experts, k = in.top_k, n = end - begin;
  if (n == 0) return 0;
  std::vector<double> f(size_t(E), 0.0), p(size_t(E), 0.0);
  for (int64_t t = begin; t < end; ++t)
    for (int64_t j = 0; j < k; ++j) f[size_t(in.indices[t * k + j])] += 1.0 / double(n * k);
  // c_e = d loss / d P_e / n = E f_e / n: every token's (normalized) score of e counts 1/n.
  std::vector<double> c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) c[size_t(e)] = double(E) * f[size_t(e)] / double(n);
  double loss = 0;
  for (int64_t t = begin; t < end; ++t) {
    const double* s = in.scores + t * E;
    double* ds = dscores.data() + t * E;
    // Sigmoid scores do not sum to 1 over the experts: they are normalized per token first
    // (s_e / sum s), as Megatron does, so P_e is again a share of the token's attention.
    double sum = 1.0;
    if (in.sigmoid) {
      sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += s[e];
      sum += 1e-20;
    }
    double dot = 0;  // sum_e c_e s_e / sum
    for (int64_t e = 0; e < E; ++e) dot += c[size_t(e)] * s[e] / sum;
    loss += dot;
    for (int64_t e = 0; e < E; ++e) {
      // d(s_e / S)/d s_j = [e == j] / S - s_e / S^2 (the second term only for sigmoid).
      double g = c[size_t(e)] / sum;
      if (in.sigmoid) g -= dot / sum;
      ds[e] += weight * g;
    }
  }
  return loss;
}

}  // namespace

MoeLosses moe_losses(const MoeLossInputs& in) {
  const int64_t N = in.tokens, E = in.experts;
  MoeLosses out;
  if (in.balancing != MoeBalancing::None && N > 0) {
    out.dscores.assign(size_t(N * E), 0.0);
    if (in.balancing == MoeBalancing::AuxLoss) {
      out.aux = balancing_group(in, 0, N, in.aux_coeff, out.dscores);
    } else {
      FSDP_CHECK(in.sequences > 0 && N % in.sequences == 0, ShapeError, "moe seq_aux_loss: ", N,
                 " tokens are not ", in.sequences, " whole sequences");
      const int64_t T = N / in.sequences;
      const double w = 1.0 / double(in.sequences);  // the mean over the sequences
      for (int64_t b = 0; b < in.sequences; ++b)
        out.aux += w * balancing_group(in, b * T, (b + 1) * T, in.aux_coeff * w, out.dscores);
    }
  }
  if (in.z_coeff > 0 && N > 0) {
    // z = mean_n lse_n^2; d z / d logit_{n,e} = 2 lse_n softmax_{n,e} / N.
    out.dlogits.assign(size_t(N * E), 0.0);
    for (int64_t t = 0; t < N; ++t) {
      const double* l = in.logits + t * E;
      const double m = *std::max_element(l, l + E);
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(l[e] - m);
      const double lse = m + std::log(s);
      out.z += lse * lse / double(N);
      for (int64_t e = 0; e < E; ++e)
        out.dlogits[size_t(t * E + e)] =
            in.z_coeff * 2.0 * lse * std::exp(l[e] - m) / s / double(N);
    }
  }
  return out;
}

}  // namespace fsdp::nn
