#include "runtime/parallel/tensor_parallel.h"

#include <vector>

#include "runtime/core/error.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"

namespace fsdp {

void CommunicatorParallelGroup::all_reduce_sum(Context& ctx, const Tensor& t) {
  comm_.all_reduce(t, ReduceOp::Sum, ctx.stream());
}

void CommunicatorParallelGroup::all_reduce_max(Context& ctx, const Tensor& t) {
  comm_.all_reduce(t, ReduceOp::Max, ctx.stream());
}

void CommunicatorParallelGroup::all_gather(Context& ctx, const Tensor& out, const Tensor& in) {
  comm_.all_gather(out, in, ctx.stream());
}

void CommunicatorParallelGroup::reduce_scatter_sum(Context& ctx, const Tensor& out,
                                                         const Tensor& in) {
  comm_.reduce_scatter(out, in, ReduceOp::Sum, ctx.stream());
}

namespace {

void check_transfer(const Communicator& comm, const Tensor& send, const Tensor& recv) {
  FSDP_CHECK(send.is_contiguous() && recv.is_contiguous() && send.numel() == recv.numel() &&
                 send.dtype() == recv.dtype(),
             ShapeError, "send_recv on group '", comm.name(), "': ", send.str(), " and ",
             recv.str(), " must be contiguous, of one size and dtype");
}

// Issued together: every rank sends to one neighbour while receiving from the other.
std::vector<Work> issue_send_recv(Communicator& comm, const Tensor& send, int to, const Tensor& recv,
                                  int from, const Stream& stream) {
  std::vector<Work> work;
  comm.group_start();
  work.push_back(comm.send(send.data_ptr(), size_t(send.numel()), send.dtype(), to, stream));
  work.push_back(comm.recv(recv.data_ptr(), size_t(recv.numel()), recv.dtype(), from, stream));
  comm.group_end();
  return work;
}

}  // namespace

void CommunicatorParallelGroup::send_recv(Context& ctx, const Tensor& send, int to,
                                                const Tensor& recv, int from) {
  check_transfer(comm_, send, recv);
  issue_send_recv(comm_, send, to, recv, from, ctx.stream());
}

std::unique_ptr<nn::PendingTransfer> CommunicatorParallelGroup::start_send_recv(
    Context& ctx, const Tensor& send, int to, const Tensor& recv, int from) {
  if (!ctx.is_cuda()) return nn::ParallelGroup::start_send_recv(ctx, send, to, recv, from);
  check_transfer(comm_, send, recv);
  auto t = std::make_unique<CommunicatorTransfer>();
  t->work = issue_send_recv(comm_, send, to, recv, from, transfers_.after(ctx));
  return t;
}

std::unique_ptr<nn::PendingTransfer> CommunicatorParallelGroup::start_all_gather(
    Context& ctx, const Tensor& out, const Tensor& in) {
  if (!ctx.is_cuda()) return nn::ParallelGroup::start_all_gather(ctx, out, in);
  auto t = std::make_unique<CommunicatorTransfer>();
  t->work.push_back(comm_.all_gather(out, in, transfers_.after(ctx)));
  return t;
}

std::unique_ptr<nn::PendingTransfer> CommunicatorParallelGroup::start_reduce_scatter_sum(
    Context& ctx, const Tensor& out, const Tensor& in) {
  if (!ctx.is_cuda()) return nn::ParallelGroup::start_reduce_scatter_sum(ctx, out, in);
  auto t = std::make_unique<CommunicatorTransfer>();
  t->work.push_back(comm_.reduce_scatter(out, in, ReduceOp::Sum, transfers_.after(ctx)));
  return t;
}

std::unique_ptr<nn::PendingTransfer> CommunicatorParallelGroup::start_all_reduce_sum(
    Context& ctx, const Tensor& t) {
  if (!ctx.is_cuda()) return nn::ParallelGroup::start_all_reduce_sum(ctx, t);
  auto transfer = std::make_unique<CommunicatorTransfer>();
  transfer->work.push_back(comm_.all_reduce(t, ReduceOp::Sum, transfers_.after(ctx)));
  return transfer;
}

namespace {
[[noreturn]] void planning_only() {
  FSDP_THROW(Error, "a planning tensor-parallel group cannot communicate: build the model's "
             "group over a communicator to run it");
}
}  // namespace

void PlanningParallelGroup::all_reduce_sum(Context&, const Tensor&) { planning_only(); }
void PlanningParallelGroup::all_reduce_max(Context&, const Tensor&) { planning_only(); }
void PlanningParallelGroup::all_gather(Context&, const Tensor&, const Tensor&) { planning_only(); }
void PlanningParallelGroup::reduce_scatter_sum(Context&, const Tensor&, const Tensor&) {
  planning_only();
}
void PlanningParallelGroup::send_recv(Context&, const Tensor&, int, const Tensor&, int) {
  planning_only();
}

namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// A whole parameter that sees only its rank's tokens: its gradient is summed over the group.
void mark_partial_grad(nn::Parameter& p) {
  nn::Placement partial = p.placement();
  partial.partial_grad = true;
  p.set_placement(std::move(partial));
}

// Slices a Linear's weight (out, in) along `dim` by `ranges` (each held by `replicas`
// ranks; empty: one), and its bias with the rows when column-parallel.
void slice_linear(nn::Linear& layer, int dim, const Ranges& ranges,
                  const std::vector<int>& replicas = {}) {
  nn::Parameter& w = layer.weight();
  w.set_parallel_slice({w.shape(), dim, ranges, replicas});
  if (layer.bias() && dim == 0)
    layer.bias()->set_parallel_slice({layer.bias()->shape(), 0, ranges, replicas});
}

std::string line(const nn::Linear& layer, nn::ParallelStyle style) {
  return layer.name() + ": " + nn::parallel_style_name(style);
}

// A fused [q heads | k heads | v heads] layer, column-parallel by heads: rank r's query
// heads, and the key/value heads they share.
void split_heads(nn::Linear& qkv, const nn::AttentionHeads& heads, nn::ParallelGroup& group,
                 bool sequence, std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const int64_t d = heads.head_dim, h = heads.n_head, hkv = heads.n_kv_head;
  FSDP_CHECK(d > 0 && h > 0 && hkv > 0 && qkv.weight().shape()[0] == (h + 2 * hkv) * d,
             ShapeError, qkv.name(), ": the layer table's heads (", h, " query, ", hkv,
             " key/value of ", d, ") do not make its ", qkv.weight().shape()[0], " rows");
  const auto q = nn::equal_part(0, h * d, r, tp, qkv.name() + " query heads");
  FSDP_CHECK(h % tp == 0, ShapeError, qkv.name(), ": ", h, " query heads do not split over ", tp,
             " ranks");
  // Fewer key/value heads than ranks (grouped-query attention): each rank holds the one
  // head its query heads share, replicated on the tp / hkv ranks of that group.
  const int replicas = hkv < tp ? tp / int(hkv) : 1;
  FSDP_CHECK(tp % replicas == 0 && (hkv >= tp || tp % hkv == 0), ShapeError, qkv.name(), ": ",
             hkv, " key/value heads can be neither split over nor replicated on ", tp, " ranks");
  const int kv_rank = r / replicas, kv_parts = tp / replicas;
  FSDP_CHECK(hkv % kv_parts == 0, ShapeError, qkv.name(), ": ", hkv, " key/value heads do not "
             "split over ", kv_parts, " ranks");
  const auto k = nn::equal_part(h * d, (h + hkv) * d, kv_rank, kv_parts, qkv.name() + " key heads");
  const auto v = nn::equal_part((h + hkv) * d, (h + 2 * hkv) * d, kv_rank, kv_parts,
                                qkv.name() + " value heads");
  slice_linear(qkv, 0, {q, k, v}, {1, replicas, replicas});
  qkv.set_parallel_style(nn::ParallelStyle::column, &group, sequence);
  report.push_back(line(qkv, nn::ParallelStyle::column));
}

// Output rows made of `parts` equal parts (such as [gate | up]), each split over the group.
void split_columns(nn::Linear& layer, int parts, nn::ParallelGroup& group, bool sequence,
                   std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const int64_t rows = layer.weight().shape()[0];
  FSDP_CHECK(parts >= 1 && rows % parts == 0, ShapeError, layer.name(), ": ", rows,
             " rows do not make ", parts, " equal parts");
  const int64_t f = rows / parts;
  Ranges ranges;
  for (int p = 0; p < parts; ++p)
    ranges.push_back(nn::equal_part(p * f, (p + 1) * f, r, tp, layer.name() + " features"));
  slice_linear(layer, 0, ranges);
  layer.set_parallel_style(nn::ParallelStyle::column, &group, sequence);
  report.push_back(line(layer, nn::ParallelStyle::column));
}

// Input features split over the group.
void split_rows(nn::Linear& layer, nn::ParallelGroup& group, bool sequence,
                std::vector<std::string>& report) {
  const int64_t in = layer.weight().shape()[1];
  slice_linear(layer, 1,
               {nn::equal_part(0, in, group.rank(), group.size(), layer.name() + " features")});
  layer.set_parallel_style(nn::ParallelStyle::row, &group, sequence);
  report.push_back(line(layer, nn::ParallelStyle::row));
}

// Sequence parallelism: what sees only this rank's tokens gets its gradient summed over
// the group: every norm the table names and the row-parallel biases.
void mark_sequence_parallel_grads(const std::vector<nn::StyledLayer>& layers,
                                  std::vector<std::string>& report) {
  for (const nn::StyledLayer& l : layers) {
    std::vector<nn::Parameter*> partial;
    if (l.row->style == nn::LayerStyle::norm || l.row->style == nn::LayerStyle::final_norm) {
      for (const auto& p : l.module->own_parameters()) partial.push_back(p.get());
    } else if (l.row->style == nn::LayerStyle::row) {
      auto& linear = nn::styled_as<nn::Linear>(l, "Linear");
      if (linear.bias()) partial.push_back(linear.bias());
    }
    for (nn::Parameter* p : partial) {
      mark_partial_grad(*p);
      report.push_back(p->name() + ": gradient summed over tp");
    }
  }
}

// A mixture-of-experts layer runs whole on every rank, on the rank's part of the sequence
// (its shared expert, a dense MLP, is split as the others are, by its own rows): the
// router's and the experts' gradients are then partial sums over the group, and the
// balancing loss counts every part's choices.
void run_moe_on_sequence_parts(nn::MoELayer& moe, nn::ParallelGroup& group, bool sequence,
                               std::vector<std::string>& report) {
  FSDP_CHECK(sequence, ConfigError, moe.name(), ": a mixture-of-experts layer under tensor "
             "parallelism needs sequence parallelism ('model.sequence_parallel'): its router "
             "and experts run on each rank's part of the sequence");
  moe.set_sequence_parallel(&group);
  for (nn::Parameter* p : {&moe.router.weight(), &moe.experts.fc(), &moe.experts.proj()}) {
    mark_partial_grad(*p);
    report.push_back(p->name() + ": on this rank's tokens, gradient summed over tp");
  }
}

// Rows [r Vp/tp, (r+1) Vp/tp) of a vocabulary table, read by the ops as a shard.
void split_vocabulary(nn::Parameter& table, nn::ParallelGroup& group,
                      std::vector<std::string>& report) {
  if (table.placement().vocabulary_group) return;  // a tied head: already split as the embedding
  const auto rows = nn::equal_part(0, table.shape()[0], group.rank(), group.size(),
                                   table.name() + " vocabulary rows");
  nn::Placement split = table.placement();
  split.slice = nn::ParallelSlice{table.shape(), 0, {rows}};
  split.vocabulary_group = &group;
  table.set_placement(std::move(split));
  report.push_back(table.name() + ": vocabulary-parallel");
}

// The one module of `style` the table names (ConfigError naming `why` otherwise).
nn::UnaryModule& single(const std::vector<nn::StyledLayer>& layers, nn::LayerStyle style,
                        const char* why) {
  nn::UnaryModule* found = nullptr;
  for (const nn::StyledLayer& l : layers)
    if (l.row->style == style) {
      FSDP_CHECK(found == nullptr || style == nn::LayerStyle::block, ConfigError, why, ": the "
                 "layer table names more than one ", nn::layer_style_name(style), " layer");
      if (!found) found = &nn::styled_as<nn::UnaryModule>(l, "one-tensor module");
    }
  FSDP_CHECK(found, ConfigError, why, ": the layer table names no ",
             nn::layer_style_name(style), " layer");
  return *found;
}

}  // namespace

std::vector<std::string> apply_tensor_parallel(nn::Module& model,
                                               const nn::VocabularyTables& vocabulary,
                                               const nn::LayerTable& table,
                                               nn::ParallelGroup& group,
                                               bool sequence_parallel) {
  std::vector<std::string> report;
  if (group.size() == 1) return report;
  if (vocabulary.tokens) split_vocabulary(*vocabulary.tokens, group, report);
  if (vocabulary.head) split_vocabulary(*vocabulary.head, group, report);
  if (vocabulary.tokens && vocabulary.positions) {
    mark_partial_grad(*vocabulary.positions);
    report.push_back(vocabulary.positions->name() + ": added on rank 0, gradient summed over tp");
  }
  const std::vector<nn::StyledLayer> layers = table.resolve(model);
  for (const nn::StyledLayer& l : layers) {
    switch (l.row->style) {
      case nn::LayerStyle::column_heads:
        split_heads(nn::styled_as<nn::Linear>(l, "Linear"), l.row->heads, group,
                    sequence_parallel, report);
        break;
      case nn::LayerStyle::column:
        split_columns(nn::styled_as<nn::Linear>(l, "Linear"), l.row->parts, group,
                      sequence_parallel, report);
        break;
      case nn::LayerStyle::row:
        split_rows(nn::styled_as<nn::Linear>(l, "Linear"), group, sequence_parallel, report);
        break;
      case nn::LayerStyle::experts:
        run_moe_on_sequence_parts(nn::styled_as<nn::MoELayer>(l, "MoELayer"), group,
                                  sequence_parallel, report);
        break;
      default:
        break;
    }
  }
  const bool vocabulary_head = vocabulary.head != nullptr;
  if (!sequence_parallel && !vocabulary_head) return report;
  nn::UnaryModule& final_norm =
      single(layers, nn::LayerStyle::final_norm, "tensor parallelism of the head or the sequence");
  nn::ParallelGroup* grp = &group;
  if (vocabulary_head) {
    // The head's input enters the tensor-parallel region: each rank's head gives a part of
    // its gradient (summed; with sequence parallelism the sequence is gathered first and
    // the gradient reduce-scattered).
    final_norm.set_output_transform([grp, sequence_parallel](autograd::Graph& g, const Tensor& x) {
      return nn::tensor_parallel_enter(g, x, *grp, sequence_parallel);
    });
    report.push_back(final_norm.name() + ": output enters the vocabulary-parallel head" +
                     (sequence_parallel ? " (gathered along the sequence)" : ""));
  }
  if (!sequence_parallel) return report;
  // The stream is split before the first block: a vocabulary-parallel embedding sums its
  // ranks' rows by a reduce-scatter along the sequence; another one's output is split.
  nn::UnaryModule& first_block = single(layers, nn::LayerStyle::block, "sequence parallelism");
  if (vocabulary.tokens) {
    nn::Placement scattered = vocabulary.tokens->placement();
    scattered.scatter_sequence = true;
    vocabulary.tokens->set_placement(std::move(scattered));
    report.push_back(vocabulary.tokens->name() + ": rows summed by a reduce-scatter along the sequence");
  } else {
    first_block.set_input_transform(
        [grp](autograd::Graph& g, const Tensor& x) { return nn::sequence_split(g, x, *grp); });
    report.push_back(first_block.name() + ": input split along the sequence");
  }
  if (!vocabulary_head) {
    final_norm.set_output_transform(
        [grp](autograd::Graph& g, const Tensor& x) { return nn::sequence_gather(g, x, *grp); });
    report.push_back(final_norm.name() + ": output gathered along the sequence");
  }
  mark_sequence_parallel_grads(layers, report);
  return report;
}

}  // namespace fsdp
