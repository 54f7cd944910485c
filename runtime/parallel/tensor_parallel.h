// Tensor parallelism applied from outside a model (Megatron's layout, as torchtitan's
// parallelize step applies it): the model is built as specs, then apply_tensor_parallel()
// slices its parameters for one rank of the tensor-parallel group and tells its layers how
// they are split, by the styles of the model's layer table (nn::LayerTable);
// FSDP then shards each rank's slices over the data-parallel group.
//
// Per transformer block, for tp ranks (rank r), as the GPT-2 and Llama tables style them:
//   attention qkv   column_heads: rank r's query heads, key heads and value heads (three
//                   row ranges of the fused weight and bias); H/tp and Hkv/tp heads each
//                   (the attention reads its heads from that slice)
//   attention proj  row: the input columns of those query heads; bias whole
//   MLP fc          column (GELU: rows [r F/tp, (r+1) F/tp); SwiGLU's gate_up, of two
//                   parts: those rows of gate and of up)
//   MLP proj        row: the same F/tp input columns; bias whole
//   MoE layer       experts: run whole on each rank's part of the sequence
// The vocabulary (given by the model's VocabularyTables) is split too, as Megatron splits it:
//   token embedding rows [r Vp/tp, (r+1) Vp/tp): each rank looks up the ids it holds (zero
//                   rows for the others) and the ranks' rows are summed; learned positions
//                   are added on rank 0 before that sum, and their gradient, which only
//                   rank 0 computes, is marked for a sum over the group
//   head            the same rows (tied to the embedding or its own): each rank computes its
//                   part of the logits and the loss merges the ranks' softmax statistics
//                   (nn::classifier_loss), so the (tokens, Vp) logits are never gathered;
//                   the head's input enters the tensor-parallel region at the final norm
//                   (its gradient is summed over the group)
// Everything else (norms) is replicated: every rank holds and updates the whole tensor,
// and, since every rank computes the same gradient for it, no gradient sum over the group
// is needed.
//
// Sequence parallelism (`sequence_parallel`) also splits the residual stream along the
// sequence between those layers: the first block's input is split (each rank keeps T/tp
// tokens; the vocabulary-parallel embedding's sum is a reduce-scatter that leaves each rank
// its part), the column-parallel layers all-gather it and the row-parallel ones
// reduce-scatter their output (instead of all-reducing it), and the final norm's output is
// gathered again for the head. The norms inside and after the blocks and the
// row-parallel biases then see only their rank's tokens: their gradients are partial sums,
// marked nn::Placement::partial_grad, summed over the group by the grad sync hook.
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/module.h"
#include "runtime/nn/tensor_parallel.h"
#include "runtime/parallel/transfer_stream.h"

namespace fsdp {

// A tensor- or context-parallel group over a communicator: its collectives run on the
// context's stream.
class CommunicatorParallelGroup : public nn::ParallelGroup {
 public:
  explicit CommunicatorParallelGroup(Communicator& comm) : comm_(comm) {}
  int size() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  void all_reduce_sum(Context& ctx, const Tensor& t) override;
  void all_reduce_max(Context& ctx, const Tensor& t) override;
  void all_gather(Context& ctx, const Tensor& out, const Tensor& in) override;
  void reduce_scatter_sum(Context& ctx, const Tensor& out, const Tensor& in) override;
  void send_recv(Context& ctx, const Tensor& send, int to, const Tensor& recv, int from) override;
  // On a GPU: the send and receive on the group's own stream, after what ctx's stream has
  // queued so far.
  std::unique_ptr<nn::PendingTransfer> start_send_recv(Context& ctx, const Tensor& send, int to,
                                                       const Tensor& recv, int from) override;
  // The same for the collectives that overlap a column-parallel layer's products.
  std::unique_ptr<nn::PendingTransfer> start_all_gather(Context& ctx, const Tensor& out,
                                                        const Tensor& in) override;
  std::unique_ptr<nn::PendingTransfer> start_reduce_scatter_sum(Context& ctx, const Tensor& out,
                                                                const Tensor& in) override;
  std::unique_ptr<nn::PendingTransfer> start_all_reduce_sum(Context& ctx, const Tensor& t) override;

 private:
  Communicator& comm_;
  TransferStream transfers_;  // the overlapped transfers' stream
};

// A group that only plans (the dry run, memory estimates): rank `rank` of `size`, never
// communicating (all_reduce_sum throws).
class PlanningParallelGroup : public nn::ParallelGroup {
 public:
  PlanningParallelGroup(int size, int rank) : size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void all_reduce_sum(Context& ctx, const Tensor& t) override;
  void all_reduce_max(Context& ctx, const Tensor& t) override;
  void all_gather(Context& ctx, const Tensor& out, const Tensor& in) override;
  void reduce_scatter_sum(Context& ctx, const Tensor& out, const Tensor& in) override;
  void send_recv(Context& ctx, const Tensor& send, int to, const Tensor& recv, int from) override;

 private:
  int size_, rank_;
};

// Slices `model`'s parameters (specs, before FSDP or materialization) for `group`'s rank
// and sets its layers' styles, as `table` names them (column, column_heads, row, experts;
// norm, final_norm and block under sequence parallelism); `vocabulary` (its tables may be
// null) says what to split along the vocabulary. Returns one line per split layer ("h.0.attn.qkv: column").
// A group of size 1 leaves the model as it is. Throws ShapeError naming the layer when its
// heads, features or vocabulary rows do not split into equal parts.
std::vector<std::string> apply_tensor_parallel(nn::Module& model,
                                               const nn::VocabularyTables& vocabulary,
                                               const nn::LayerTable& table,
                                               nn::ParallelGroup& group,
                                               bool sequence_parallel = false);

}  // namespace fsdp
