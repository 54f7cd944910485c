// What tensor-parallel layers need to communicate, without the layers knowing how.
//
// A plan from outside the model (runtime/parallel) slices parameters (ParallelSlice) and
// gives layers a style and a ParallelGroup; runtime/nn stays free of communicators.
// The differentiable ops below are the two conjugate regions of Megatron's tensor
// parallelism:
//   enter: the input of a column-parallel layer. Forward: identity (every rank holds the
//          whole activation). Backward: the ranks' partial input gradients are summed.
//   leave: the output of a row-parallel layer. Forward: the ranks' partial outputs are
//          summed. Backward: identity.
// With sequence parallelism the residual stream between those regions is split along the
// sequence (each rank holds T/tp of the T tokens of every sequence: x (B, T/tp, C)): enter
// all-gathers the sequence (backward: reduce-scatter), leave reduce-scatters it (backward:
// all-gather), and the norms and biases between them see only their rank's tokens.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "kernels/ops.h"
#include "runtime/autograd/graph.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/parameter.h"
#include "runtime/nn/pending_transfer.h"

namespace fsdp::nn {

using autograd::Graph;

// A group of ranks that a layer's collectives run over, whatever split it serves: tensor
// parallelism (sliced weights), context parallelism (sliced sequences), the FP8 amaxes of a
// split layer. runtime/parallel implements it over a communicator.
class ParallelGroup {
 public:
  virtual ~ParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // t (contiguous, on ctx's device) = the sum of t over the group, in place, queued on
  // ctx's stream. Every rank of the group calls it in the same order.
  virtual void all_reduce_sum(Context& ctx, const Tensor& t) = 0;
  // t = the elementwise maximum of t over the group, as all_reduce_sum.
  virtual void all_reduce_max(Context& ctx, const Tensor& t) = 0;
  // out (size() * n, contiguous) = every rank's in (n) in rank order.
  virtual void all_gather(Context& ctx, const Tensor& out, const Tensor& in) = 0;
  // out (n) = the sum over the ranks of part `rank()` of their in (size() * n).
  virtual void reduce_scatter_sum(Context& ctx, const Tensor& out, const Tensor& in) = 0;
  // Sends `send` to rank `to` while receiving `recv` (as large) from rank `from`, queued on
  // ctx's stream (a ring step of context parallelism: every rank sends to its successor).
  virtual void send_recv(Context& ctx, const Tensor& send, int to, const Tensor& recv, int from) = 0;
  // send_recv, started now and finished by the returned transfer: on a GPU it runs beside
  // ctx's stream, so that the caller computes meanwhile (neither tensor may be written
  // until finish()). By default, and on the CPU, it completes here.
  virtual std::unique_ptr<PendingTransfer> start_send_recv(Context& ctx, const Tensor& send,
                                                           int to, const Tensor& recv, int from);
  // all_gather, reduce_scatter_sum and all_reduce_sum started now and finished by the
  // returned transfer, to overlap them with compute the same way (the tensors may be neither
  // read nor written until finish()). By default, and on the CPU, they complete here.
  virtual std::unique_ptr<PendingTransfer> start_all_gather(Context& ctx, const Tensor& out,
                                                            const Tensor& in);
  virtual std::unique_ptr<PendingTransfer> start_reduce_scatter_sum(Context& ctx, const Tensor& out,
                                                                    const Tensor& in);
  virtual std::unique_ptr<PendingTransfer> start_all_reduce_sum(Context& ctx, const Tensor& t);
};

// Sequence parallelism's two exchanges, started now and finished later (not differentiable;
// the ops below and column-parallel linears use them). Each keeps its tensors alive until
// finish(), which makes ctx's stream wait and returns the result.
//   gather:         x (B, T/tp, C) of every rank -> (B, T, C), the ranks' parts in order.
//   reduce-scatter: y (B, T, C) of every rank -> this rank's (B, T/tp, C) of their sum.
class SequenceExchange {
 public:
  static SequenceExchange start_gather(Context& ctx, const Tensor& x, ParallelGroup& group);
  static SequenceExchange start_reduce_scatter(Context& ctx, const Tensor& y,
                                               ParallelGroup& group);
  Tensor finish(Context& ctx);

 private:
  bool gather_ = false;
  Tensor in_, parts_, out_;  // parts_: (tp, B, T/tp, C), rank-major
  std::unique_ptr<PendingTransfer> pending_;
};

// How a column-parallel linear (or the MLP's first one) takes its input from its
// tensor-parallel group (no group: a plain linear). Without `sequence`, x is whole on every
// rank and the input gradient is summed over the group; with it, x is this rank's part of
// the sequence (B, T/tp, in), all-gathered to (B, T, in), and the input gradient is
// reduce-scattered back. Megatron's schedule: only x's own part is kept for the backward,
// which gathers it again beside the input-gradient product and then sums the input
// gradient beside the weight-gradient product.
struct ColumnParallelInput {
  ParallelGroup* group = nullptr;
  bool sequence = false;
};

// A column-parallel layer's input gradient, started on its way to the other ranks: this
// rank's part dx (..., in) (dy @ W of its output features, in the whole input's shape),
// summed over the group in place, or reduce-scattered along the sequence to this rank's
// (B, T/tp, in).
class ColumnInputGrad {
 public:
  static ColumnInputGrad start(Context& ctx, const Tensor& dx, const ColumnParallelInput& column);
  // The input gradient of a (column-parallel or plain) linear in its backward: `product(dx,
  // beta)` writes dx (n, in) = dy @ W (+ beta dx). Without a group it writes x's gradient
  // directly (nothing to finish); with one, a new part in x's shape `x_shape` that is then
  // started on its way (finish() it after the weight gradient). Empty when x takes none.
  using Product = std::function<void(const Tensor& dx, double beta)>;
  static std::optional<ColumnInputGrad> compute(Graph& g, const autograd::GradTarget& x,
                                                const ColumnParallelInput& column,
                                                const Shape& x_shape, int64_t in_features,
                                                DType dtype, const Product& product);
  Tensor finish(Context& ctx);

 private:
  Tensor dx_;
  std::optional<SequenceExchange> sequence_;
  std::unique_ptr<PendingTransfer> pending_;
};

// How a layer is split over the tensor-parallel group.
enum class ParallelStyle : uint8_t {
  replicated,  // whole on every rank
  column,      // output features split: weight rows (and bias) sliced, input whole
  row,         // input features split: weight columns sliced, output summed, bias whole
};
const char* parallel_style_name(ParallelStyle s);  // "replicated", "column", "row"

// Identity forward; backward sums x's gradient over `group`. With `sequence`, x (B, T/tp, C)
// is this rank's part of the sequence: forward all-gathers it to (B, T, C), backward
// reduce-scatters the gradient.
Tensor tensor_parallel_enter(Graph& g, const Tensor& x, ParallelGroup& group,
                             bool sequence = false);
// Forward sums y over `group` (into a new tensor); backward is the identity. With
// `sequence`, y (B, T, C) is reduce-scattered to this rank's (B, T/tp, C); backward
// all-gathers the gradient.
Tensor tensor_parallel_leave(Graph& g, const Tensor& y, ParallelGroup& group,
                             bool sequence = false);
// Sequence parallelism's ends. split: x (B, T, C), the same on every rank -> this rank's
// (B, T/tp, C); backward all-gathers the gradient. gather: x (B, T/tp, C) -> (B, T, C);
// backward keeps this rank's part of the gradient, which every rank holds whole and equal
// (what follows is replicated).
Tensor sequence_split(Graph& g, const Tensor& x, ParallelGroup& group);
Tensor sequence_gather(Graph& g, const Tensor& x, ParallelGroup& group);
// What a model tells a vocabulary-parallel plan: the parameters whose rows are the
// vocabulary (the token embedding, and the classifier head, which may be the same tied
// parameter), and a learned position table added to the token embedding (null if none).
struct VocabularyTables {
  Parameter* tokens = nullptr;
  Parameter* head = nullptr;
  Parameter* positions = nullptr;
};

// The ids a vocabulary-parallel table's local rows are (its slice of dim 0). ShapeError
// unless `table` holds one range of rows.
ops::VocabShard vocab_shard(const Parameter& table);
// y (..., N) + bias (N) broadcast over the rows; backward: bias.grad += column sums.
Tensor add_bias(Graph& g, const Tensor& y, Parameter& bias);

}  // namespace fsdp::nn
