#include "runtime/parallel/tensor_parallel.h"

#include <vector>

#include "runtime/core/error.h"
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

void split_attention(nn::CausalSelfAttention& a, nn::ParallelGroup& group, bool sequence,
                     std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const nn::AttentionConfig& c = a.config();
  const int64_t d = c.head_dim, h = c.n_head, hkv = c.n_kv_head;
  const auto q = nn::equal_part(0, h * d, r, tp, a.name() + " query heads");
  // Fewer key/value heads than ranks (grouped-query attention): each rank holds the one
  // head its query heads share, replicated on the tp / hkv ranks of that group.
  const int replicas = hkv < tp ? tp / int(hkv) : 1;
  FSDP_CHECK(tp % replicas == 0 && (hkv >= tp || tp % hkv == 0), ShapeError, a.name(), ": ",
             hkv, " key/value heads can be neither split over nor replicated on ", tp, " ranks");
  const int kv_rank = r / replicas, kv_parts = tp / replicas;
  const auto k = nn::equal_part(h * d, (h + hkv) * d, kv_rank, kv_parts, a.name() + " key heads");
  const auto v = nn::equal_part((h + hkv) * d, (h + 2 * hkv) * d, kv_rank, kv_parts,
                                a.name() + " value heads");
  slice_linear(a.qkv, 0, {q, k, v}, {1, replicas, replicas});
  a.qkv.set_parallel_style(nn::ParallelStyle::column, &group, sequence);
  slice_linear(a.proj, 1, {q});
  a.proj.set_parallel_style(nn::ParallelStyle::row, &group, sequence);
  a.set_local_heads(h / tp, hkv / kv_parts);
  report.push_back(line(a.qkv, nn::ParallelStyle::column));
  report.push_back(line(a.proj, nn::ParallelStyle::row));
}

// fc (hidden rows, made of `parts` equal parts such as [gate | up]) column-parallel, proj
// (C, F) row-parallel over the same F/tp features.
void split_mlp(nn::Linear& fc, int parts, nn::Linear& proj, nn::ParallelGroup& group,
               bool sequence, std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const int64_t f = proj.weight().shape()[1];
  Ranges rows;
  for (int p = 0; p < parts; ++p)
    rows.push_back(nn::equal_part(p * f, (p + 1) * f, r, tp, fc.name() + " features"));
  slice_linear(fc, 0, rows);
  fc.set_parallel_style(nn::ParallelStyle::column, &group, sequence);
  slice_linear(proj, 1, {nn::equal_part(0, f, r, tp, proj.name() + " features")});
  proj.set_parallel_style(nn::ParallelStyle::row, &group, sequence);
  report.push_back(line(fc, nn::ParallelStyle::column));
  report.push_back(line(proj, nn::ParallelStyle::row));
}

// Sequence parallelism: what sees only this rank's tokens gets its gradient summed over
// the group: every norm inside the blocks, the final norm, and the row-parallel biases.
void mark_sequence_parallel_grads(nn::Module& model, std::vector<std::string>& report) {
  for (nn::Module* m : model.modules()) {
    const std::string kind = m->kind();
    const bool norm = kind == "layernorm" || kind == "rmsnorm";
    auto* linear = dynamic_cast<nn::Linear*>(m);
    const bool row_bias = linear && linear->parallel_style() == nn::ParallelStyle::row && linear->bias();
    if (!norm && !row_bias) continue;
    for (const auto& p : m->own_parameters())
      if (norm || p.get() == linear->bias()) {
        mark_partial_grad(*p);
        report.push_back(p->name() + ": gradient summed over tp");
      }
  }
}

// A mixture-of-experts layer runs whole on every rank, on the rank's part of the sequence
// (its shared expert, a dense MLP, is split as the others are): the router's and the
// experts' gradients are then partial sums over the group, and the balancing loss counts
// every part's choices.
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

}  // namespace

std::vector<std::string> apply_tensor_parallel(nn::Module& model,
                                               const nn::VocabularyTables& vocabulary,
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
  nn::UnaryModule* first_block = nullptr;
  for (nn::Module* m : model.modules()) {
    if (auto* a = dynamic_cast<nn::CausalSelfAttention*>(m)) {
      split_attention(*a, group, sequence_parallel, report);
    } else if (auto* g = dynamic_cast<nn::GeluMLP*>(m)) {
      split_mlp(g->fc, 1, g->proj, group, sequence_parallel, report);
    } else if (auto* s = dynamic_cast<nn::SwiGLUMLP*>(m)) {
      split_mlp(s->gate_up, 2, s->proj, group, sequence_parallel, report);
    } else if (auto* moe = dynamic_cast<nn::MoELayer*>(m)) {
      run_moe_on_sequence_parts(*moe, group, sequence_parallel, report);
    }
    if (!first_block && m->kind() == "block") first_block = dynamic_cast<nn::UnaryModule*>(m);
  }
  const bool vocabulary_head = vocabulary.head != nullptr;
  if (!sequence_parallel && !vocabulary_head) return report;
  // The final norm (the model's direct child of a norm kind) feeds the head.
  nn::UnaryModule* final_norm = nullptr;
  for (nn::Module* m : model.children())
    if (m->kind() == "layernorm" || m->kind() == "rmsnorm") final_norm = dynamic_cast<nn::UnaryModule*>(m);
  FSDP_CHECK(final_norm, ConfigError, "tensor parallelism of the head or the sequence needs a "
             "final norm (a direct child of the model of kind \"layernorm\" or \"rmsnorm\")");
  nn::ParallelGroup* grp = &group;
  if (vocabulary_head) {
    // The head's input enters the tensor-parallel region: each rank's head gives a part of
    // its gradient (summed; with sequence parallelism the sequence is gathered first and
    // the gradient reduce-scattered).
    final_norm->set_output_transform([grp, sequence_parallel](autograd::Graph& g, const Tensor& x) {
      return nn::tensor_parallel_enter(g, x, *grp, sequence_parallel);
    });
    report.push_back(final_norm->name() + ": output enters the vocabulary-parallel head" +
                     (sequence_parallel ? " (gathered along the sequence)" : ""));
  }
  if (!sequence_parallel) return report;
  // The stream is split before the first block: a vocabulary-parallel embedding sums its
  // ranks' rows by a reduce-scatter along the sequence; another one's output is split.
  FSDP_CHECK(first_block, ConfigError, "sequence parallelism needs a model of blocks (modules "
             "of kind \"block\") followed by a final norm");
  if (vocabulary.tokens) {
    nn::Placement scattered = vocabulary.tokens->placement();
    scattered.scatter_sequence = true;
    vocabulary.tokens->set_placement(std::move(scattered));
    report.push_back(vocabulary.tokens->name() + ": rows summed by a reduce-scatter along the sequence");
  } else {
    first_block->set_input_transform(
        [grp](autograd::Graph& g, const Tensor& x) { return nn::sequence_split(g, x, *grp); });
    report.push_back(first_block->name() + ": input split along the sequence");
  }
  if (!vocabulary_head) {
    final_norm->set_output_transform(
        [grp](autograd::Graph& g, const Tensor& x) { return nn::sequence_gather(g, x, *grp); });
    report.push_back(final_norm->name() + ": output gathered along the sequence");
  }
  mark_sequence_parallel_grads(model, report);
  return report;
}

}  // namespace fsdp
