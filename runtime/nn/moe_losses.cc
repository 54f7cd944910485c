#include "runtime/nn/moe_losses.h"

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "runtime/nn/tensor_parallel.h"

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

MoeLosses moe_losses(Context& ctx, const Tensor& scores, const Tensor& logits,
                     const Tensor& indices, const MoeLossOptions& o) {
  const int64_t N = scores.size(0), E = scores.size(1);
  const int cp = o.context_group ? o.context_group->size() : 1;
  const int sp = o.sequence_group ? o.sequence_group->size() : 1;
  MoeLosses out;
  if (N == 0) return out;
  if (o.balancing != MoeBalancing::None) {
    // seq_aux_loss: per sequence, averaged over the sequences.
    const int64_t groups = o.balancing == MoeBalancing::SeqAuxLoss ? o.sequences : 1;
    FSDP_CHECK(groups > 0 && N % groups == 0, ShapeError, "moe seq_aux_loss: ", N,
               " tokens are not ", groups, " whole sequences");
    const Tensor per_token = ctx.empty(Shape{N}, scores.dtype());  // (N)
    out.dscores = ctx.empty(Shape{N, E}, scores.dtype());         // (N, E)
    if (cp * sp > 1) {
      // The whole sequences' choices (groups, E), and this rank's terms of their loss.
      const Tensor run_counts = ctx.empty(Shape{groups, E}, DType::i32);
      ops::moe_group_expert_counts(ctx, run_counts, indices, groups);
      if (cp > 1) o.context_group->all_reduce_sum(ctx, run_counts);
      if (sp > 1) o.sequence_group->all_reduce_sum(ctx, run_counts);
      ops::moe_balancing_loss(ctx, per_token, out.dscores, scores, indices, groups, o.sigmoid,
                              o.aux_coeff * cp, run_counts, N / groups * cp * sp);
    } else {
      ops::moe_balancing_loss(ctx, per_token, out.dscores, scores, indices, groups, o.sigmoid,
                              o.aux_coeff);
    }
    out.aux = ops::sum(ctx, per_token);
    if (cp * sp > 1) ops::scale(ctx, out.aux, out.aux, double(cp * sp));
  }
  if (o.z_coeff > 0) {
    const Tensor per_token = ctx.empty(Shape{N}, scores.dtype());  // (N)
    out.dlogits = ctx.empty(Shape{N, E}, logits.dtype());         // (N, E)
    ops::moe_z_loss(ctx, per_token, out.dlogits, logits, o.z_coeff / sp);
    out.z = ops::sum(ctx, per_token);
  }
  return out;
}

}  // namespace fsdp::nn
