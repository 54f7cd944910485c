// Context-parallel attention, by all-gathered keys and values or by a ring.
//
// Both start alike: each rank rotates its queries and keys at their positions and packs its
// keys and values (2, B, 2c, Hkv, D). A query chunk then meets every key chunk at or before
// it: the chunk at its own position under the causal mask, earlier chunks whole.
//   all_gather: every rank's keys and values are gathered and put in sequence order, and each
//     query chunk runs once against the keys up to its last position (ops::attention_forward
//     with L > T); backward adds each chunk's key and value gradients into (T, B) buffers and
//     reduce-scatters them back to the ranks holding those keys.
//   ring: the keys and values travel around the ring (rank r sends to r + 1), one rank's per
//     step; each step's blocks run separately and merge into the running output by their
//     log-sum-exps. Backward runs the same blocks against the final output and log-sum-exp
//     (which makes each block's gradients exact parts of the whole), with the key and value
//     gradients travelling along with the keys and values and arriving home after cp steps.
//     On a GPU each step's keys and values travel on the group's own stream while the step
//     before computes (ParallelGroup::start_send_recv).
#include "runtime/nn/context_parallel.h"

#include <cmath>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

ContextParallelLayout ContextParallelLayout::make(int64_t seq, int cp, int rank) {
  FSDP_CHECK(cp >= 1 && rank >= 0 && rank < cp, ShapeError, "context parallelism: rank ", rank,
             " of ", cp);
  FSDP_CHECK(seq > 0 && seq % (2 * cp) == 0, ShapeError, "context parallelism: a sequence of ",
             seq, " tokens does not split into 2 x ", cp, " equal chunks");
  return {seq, cp, rank};
}

namespace {

// out = the two local chunks of x (B, 2c, heads, D) rotated at their positions in the
// sequence (out is x, or shares no memory with it).
void rope_chunks(Context& ctx, const Tensor& out, const Tensor& x,
                 const ContextParallelLayout& layout, double theta, bool inverse) {
  const int64_t c = layout.chunk();
  for (int i = 0; i < 2; ++i)
    ops::rope(ctx, out.narrow(1, i * c, c), x.narrow(1, i * c, c), theta, inverse,
              layout.chunk_begin(i));
}

// acc += block, in acc's dtype (the statistics dtype: f32 beside bf16 blocks).
void accumulate(Context& ctx, const Tensor& acc, const Tensor& block) {
  ops::add(ctx, acc, acc, block.dtype() == acc.dtype() ? block : ops::cast(ctx, block, acc.dtype()));
}

// The blocks of the ring: query chunk i of `rank` against key chunk j of `source` when that
// key chunk is at or before it; causal when it is the same chunk.
struct RingBlock {
  int i, j;
  bool causal;
};
std::vector<RingBlock> ring_blocks(const ContextParallelLayout& layout, int source) {
  std::vector<RingBlock> out;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const int64_t a = layout.chunk_of(layout.rank, i), b = layout.chunk_of(source, j);
      if (b <= a) out.push_back({i, j, a == b});
    }
  return out;
}

// (Over 80 lines on purpose: an op's forward and the backward closure it records are one
// function, so the tensors the forward saves and the backward reads stay in one view.)
Tensor ring_attention(Graph& g, const Tensor& qkv, const Tensor& q, const Tensor& kv,
                      int64_t n_head, int64_t n_kv_head, double rope_theta,
                      const ContextParallelLayout& layout, ParallelGroup& group) {
  Context& ctx = g.ctx();
  const int64_t b = q.size(0), tl = q.size(1), d = q.size(3), c = layout.chunk();
  const int cp = layout.cp, r = layout.rank, next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const DType dt = q.dtype(), sd = stat_dtype(dt);
  // The running output and log-sum-exp of each query chunk: (2, B, c, H, D) and (2, B, H, c).
  const Tensor acc = ops::zeros(ctx, Shape{2, b, c, n_head, d}, sd);
  const Tensor lse = ops::full(ctx, Shape{2, b, n_head, c}, sd, -INFINITY);
  const Tensor block_out = ctx.empty(Shape{b, c, n_head, d}, dt);
  const Tensor block_lse = ctx.empty(Shape{b, n_head, c}, sd);
  Tensor held = kv, arriving = ctx.empty(kv.shape(), dt);
  for (int step = 0; step < cp; ++step) {
    const int source = (r + cp - step) % cp;  // whose keys and values this rank holds
    // The next rank's keys and values arrive while these are used.
    std::unique_ptr<PendingTransfer> transfer;
    if (step + 1 < cp) transfer = group.start_send_recv(ctx, held, next, arriving, prev);
    for (const RingBlock& blk : ring_blocks(layout, source)) {
      ops::attention_forward(ctx, block_out, block_lse, q.narrow(1, blk.i * c, c),
                             held.select(0, 0).narrow(1, blk.j * c, c),
                             held.select(0, 1).narrow(1, blk.j * c, c), 0.0, blk.causal);
      ops::attention_merge(ctx, acc.select(0, blk.i), lse.select(0, blk.i), block_out, block_lse);
    }
    if (!transfer) break;
    transfer->finish(ctx);
    std::swap(held, arriving);
    if (step == 0) arriving = ctx.empty(kv.shape(), dt);  // keep this rank's own for backward
  }
  const Tensor chunk_out = acc.dtype() == dt ? acc : ops::cast(ctx, acc, dt);  // (2, B, c, H, D)
  Tensor out = ctx.empty(Shape{b, tl, n_head, d}, dt);
  for (int i = 0; i < 2; ++i) ops::copy(ctx, out.narrow(1, i * c, c), chunk_out.select(0, i));
  out = out.view(Shape{b, tl, n_head * d});
  if (!g.should_record({&qkv}, false)) return out;

  out = Graph::track(out);
  ParallelGroup* grp = &group;
  g.record("context_parallel_attention:ring", {out.autograd_meta()},
           [tqkv = Graph::target(qkv), om = out.autograd_meta(), q, kv, chunk_out, lse, layout,
            grp, b, tl, c, d, n_head, n_kv_head, rope_theta](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             Context& ctx = g.ctx();
             const int cp = layout.cp, r = layout.rank;
             const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
             const DType dt = q.dtype(), sd = stat_dtype(dt);
             const int64_t heads = n_head + 2 * n_kv_head;
             const Tensor dout4 = ops::contiguous(ctx, dout).view(Shape{b, tl, n_head, d});
             const Tensor dq_acc = ops::zeros(ctx, Shape{2, b, c, n_head, d}, sd);
             // The held keys' and values' gradients, travelling with them: (2 kv, 2 chunks,
             // B, c, Hkv, D), each block contiguous.
             const Shape dkv_shape{2, 2, b, c, n_kv_head, d};
             Tensor dkv = ops::zeros(ctx, dkv_shape, sd), dkv_arriving = ctx.empty(dkv_shape, sd);
             Tensor held = kv, arriving = ctx.empty(kv.shape(), dt);
             const Tensor dq_b = ctx.empty(Shape{b, c, n_head, d}, dt);
             const Tensor dk_b = ctx.empty(Shape{b, c, n_kv_head, d}, dt);
             const Tensor dv_b = ctx.empty(Shape{b, c, n_kv_head, d}, dt);
             for (int step = 0; step < cp; ++step) {
               const int source = (r + cp - step) % cp;
               // The next keys and values arrive while these are used; their gradients,
               // complete only after this step's blocks, follow in line.
               std::unique_ptr<PendingTransfer> transfer;
               if (step + 1 < cp) transfer = grp->start_send_recv(ctx, held, next, arriving, prev);
               for (const RingBlock& blk : ring_blocks(layout, source)) {
                 ops::attention_backward(ctx, dq_b, dk_b, dv_b, dout4.narrow(1, blk.i * c, c),
                                         chunk_out.select(0, blk.i), lse.select(0, blk.i),
                                         q.narrow(1, blk.i * c, c),
                                         held.select(0, 0).narrow(1, blk.j * c, c),
                                         held.select(0, 1).narrow(1, blk.j * c, c), 0.0, blk.causal);
                 accumulate(ctx, dq_acc.select(0, blk.i), dq_b);
                 accumulate(ctx, dkv.select(0, 0).select(0, blk.j), dk_b);
                 accumulate(ctx, dkv.select(0, 1).select(0, blk.j), dv_b);
               }
               // The gradients go on with the keys and values; after the last step only the
               // gradients travel, to their owner.
               grp->send_recv(ctx, dkv, next, dkv_arriving, prev);
               std::swap(dkv, dkv_arriving);
               if (!transfer) break;
               transfer->finish(ctx);
               std::swap(held, arriving);
               if (step == 0) arriving = ctx.empty(kv.shape(), dt);
             }
             detail::overwrite_grad(g, tqkv, [&](const Tensor& dqkv) {
               const Tensor dfused = dqkv.view(Shape{b, tl, heads, d});
               const Tensor dq = dfused.slice(2, 0, n_head);
               const Tensor dk = dfused.slice(2, n_head, n_head + n_kv_head);
               const Tensor dv = dfused.slice(2, n_head + n_kv_head, heads);
               for (int i = 0; i < 2; ++i) {
                 ops::copy(ctx, dq.narrow(1, i * c, c), dq_acc.select(0, i));
                 ops::copy(ctx, dk.narrow(1, i * c, c), dkv.select(0, 0).select(0, i));
                 ops::copy(ctx, dv.narrow(1, i * c, c), dkv.select(0, 1).select(0, i));
               }
               if (rope_theta > 0) {  // gradients of the rotated q, k -> of the unrotated ones
                 rope_chunks(ctx, dq, dq, layout, rope_theta, true);
                 rope_chunks(ctx, dk, dk, layout, rope_theta, true);
               }
             });
           });
  return out;
}

}  // namespace

// (Over 80 lines on purpose: an op's forward and the backward closure it records are one
// function, so the tensors the forward saves and the backward reads stay in one view.)
Tensor context_parallel_attention(Graph& g, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  double rope_theta, const ContextParallelLayout& layout,
                                  ParallelGroup& group, ContextParallelComm comm) {
  Context& ctx = g.ctx();
  FSDP_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, ShapeError,
             "attention: ", n_head, " query heads cannot share ", n_kv_head, " key/value heads");
  const int64_t heads = n_head + 2 * n_kv_head;
  FSDP_CHECK(qkv.dim() == 3 && qkv.size(1) == layout.local_seq() && qkv.size(2) % heads == 0,
             ShapeError, "context-parallel attention: qkv ", qkv.str(), " must be (B, ",
             layout.local_seq(), ", (H + 2 Hkv) D) with H = ", n_head, ", Hkv = ", n_kv_head);
  FSDP_CHECK(group.size() == layout.cp && group.rank() == layout.rank, ValueError,
             "context-parallel attention: a layout of rank ", layout.rank, " of ", layout.cp,
             " on rank ", group.rank(), " of a group of ", group.size());
  const int64_t b = qkv.size(0), tl = qkv.size(1), d = qkv.size(2) / heads;
  const int64_t c = layout.chunk(), t = layout.seq, cp = layout.cp;
  const Tensor fused = ops::contiguous(ctx, qkv).view(Shape{b, tl, heads, d});
  // The queries (B, 2c, H, D), and this rank's keys and values packed for the all-gather
  // (2, B, 2c, Hkv, D): copies of the fused projection's slices, the queries and keys
  // rotated as they are copied.
  const Tensor q = ctx.empty(Shape{b, tl, n_head, d}, qkv.dtype());
  const Shape kv_shape{2, b, tl, n_kv_head, d};
  const Tensor kv = ctx.empty(kv_shape, qkv.dtype());
  const Tensor q_in = fused.slice(2, 0, n_head), k_in = fused.slice(2, n_head, n_head + n_kv_head);
  if (rope_theta > 0) {
    rope_chunks(ctx, q, q_in, layout, rope_theta, false);
    rope_chunks(ctx, kv.select(0, 0), k_in, layout, rope_theta, false);
  } else {
    ops::copy(ctx, q, q_in);
    ops::copy(ctx, kv.select(0, 0), k_in);
  }
  ops::copy(ctx, kv.select(0, 1), fused.slice(2, n_head + n_kv_head, heads));
  if (comm == ContextParallelComm::ring)
    return ring_attention(g, qkv, q, kv, n_head, n_kv_head, rope_theta, layout, group);
  const int64_t kv_numel = kv.numel();
  const Tensor all = ctx.empty(Shape{cp * kv_numel}, qkv.dtype());  // (cp, 2, B, 2c, Hkv, D)
  group.all_gather(ctx, all, kv.view(Shape{kv_numel}));
  // Every rank's chunks in sequence order: (2, B, T, Hkv, D).
  const Tensor whole = ctx.empty(Shape{2, b, t, n_kv_head, d}, qkv.dtype());
  for (int r = 0; r < cp; ++r) {
    const Tensor theirs = all.narrow(0, r * kv_numel, kv_numel).view(kv_shape);
    for (int i = 0; i < 2; ++i)
      ops::copy(ctx, whole.narrow(2, layout.chunk_of(r, i) * c, c), theirs.narrow(2, i * c, c));
  }
  const Tensor keys = whole.select(0, 0), values = whole.select(0, 1);  // (B, T, Hkv, D)
  // Each local chunk against the keys up to its last position.
  const Tensor chunk_out = ctx.empty(Shape{2, b, c, n_head, d}, qkv.dtype());
  const Tensor lse = ctx.empty(Shape{2, b, n_head, c}, stat_dtype(qkv.dtype()));
  Tensor out = ctx.empty(Shape{b, tl, n_head, d}, qkv.dtype());  // (B, 2c, H, D)
  for (int i = 0; i < 2; ++i) {
    const int64_t end = layout.chunk_begin(i) + c;
    ops::attention_forward(ctx, chunk_out.select(0, i), lse.select(0, i), q.narrow(1, i * c, c),
                           keys.narrow(1, 0, end), values.narrow(1, 0, end));
    ops::copy(ctx, out.narrow(1, i * c, c), chunk_out.select(0, i));
  }
  out = out.view(Shape{b, tl, n_head * d});
  if (!g.should_record({&qkv}, false)) return out;

  out = Graph::track(out);
  ParallelGroup* grp = &group;
  g.record("context_parallel_attention", {out.autograd_meta()},
           [tqkv = Graph::target(qkv), om = out.autograd_meta(), q, keys, values, chunk_out, lse,
            layout, grp, b, tl, c, d, n_head, n_kv_head, heads, rope_theta](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             Context& ctx = g.ctx();
             const int64_t t = layout.seq, cp = layout.cp;
             const Tensor dout4 = ops::contiguous(ctx, dout).view(Shape{b, tl, n_head, d});
             // The keys' and values' gradients over the whole sequence, from this rank's
             // queries: (2, T, B, Hkv, D), sequence-major so that a prefix of it is
             // contiguous; the kernels see (B, T, Hkv, D) views of it.
             const Tensor dwhole = ops::zeros(ctx, Shape{2, t, b, n_kv_head, d}, keys.dtype());
             detail::overwrite_grad(g, tqkv, [&](const Tensor& dqkv) {
               const Tensor dfused = dqkv.view(Shape{b, tl, heads, d});
               const Tensor dq = dfused.slice(2, 0, n_head);
               for (int i = 0; i < 2; ++i) {
                 const int64_t end = layout.chunk_begin(i) + c;
                 const Tensor dkv = ctx.empty(Shape{2, end, b, n_kv_head, d}, keys.dtype());
                 const Tensor dk = dkv.select(0, 0), dv = dkv.select(0, 1);  // (end, B, Hkv, D)
                 ops::attention_backward(ctx, dq.narrow(1, i * c, c), dk.transpose(0, 1),
                                         dv.transpose(0, 1), dout4.narrow(1, i * c, c),
                                         chunk_out.select(0, i), lse.select(0, i),
                                         q.narrow(1, i * c, c), keys.narrow(1, 0, end),
                                         values.narrow(1, 0, end));
                 for (int kv = 0; kv < 2; ++kv) {
                   const Tensor sum = dwhole.select(0, kv).narrow(0, 0, end);
                   ops::add(ctx, sum, sum, dkv.select(0, kv));
                 }
               }
               // Back to the ranks holding those keys, summed over every rank's queries.
               const Shape kv_shape{2, b, tl, n_kv_head, d};
               const int64_t kv_numel = kv_shape.numel();
               const Tensor packed = ctx.empty(Shape{cp * kv_numel}, keys.dtype());
               for (int r = 0; r < cp; ++r) {
                 const Tensor theirs = packed.narrow(0, r * kv_numel, kv_numel).view(kv_shape);
                 for (int i = 0; i < 2; ++i)
                   ops::copy(ctx, theirs.narrow(2, i * c, c),
                             dwhole.narrow(1, layout.chunk_of(r, i) * c, c).transpose(1, 2));
               }
               const Tensor mine = ctx.empty(kv_shape, keys.dtype());
               grp->reduce_scatter_sum(ctx, mine.view(Shape{kv_numel}), packed);
               if (rope_theta > 0) {  // gradients of the rotated q, k -> of the unrotated ones
                 rope_chunks(ctx, dq, dq, layout, rope_theta, true);
                 rope_chunks(ctx, mine.select(0, 0), mine.select(0, 0), layout, rope_theta, true);
               }
               ops::copy(ctx, dfused.slice(2, n_head, n_head + n_kv_head), mine.select(0, 0));
               ops::copy(ctx, dfused.slice(2, n_head + n_kv_head, heads), mine.select(0, 1));
             });
           });
  return out;
}

}  // namespace fsdp::nn
