// Differentiable rotary embeddings and causal self-attention.
#include "kernels/ops.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

using detail::overwrite_grad;

namespace {

// t (B, T, H, D) with each head's D values contiguous, as the rotary kernels read them.
Tensor heads_contiguous(Context& ctx, const Tensor& t) {
  return t.stride(3) == 1 ? t : ops::contiguous(ctx, t);
}

}  // namespace

Tensor rope(Graph& g, const Tensor& x, double theta) {
  Context& ctx = g.ctx();
  FSDP_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, ShapeError, "rope: input ", x.str(),
             " must be (B, T, H, D) with an even D");
  FSDP_CHECK(theta > 0, ValueError, "rope: theta must be positive, got ", theta);
  Tensor out = ctx.empty(x.shape(), x.dtype());  // (B, T, H, D)
  ops::rope(ctx, out, heads_contiguous(ctx, x), theta, false);
  if (!g.should_record({&x}, false)) return out;

  out = Graph::track(out);
  g.record("rope", {out.autograd_meta()},
           [tx = Graph::target(x), om = out.autograd_meta(), theta](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             // The rotation is orthogonal: its backward is the inverse rotation.
             const Tensor dx = g.ctx().empty(dout.shape(), dout.dtype());
             ops::rope(g.ctx(), dx, heads_contiguous(g.ctx(), dout), theta, true);
             g.accumulate(tx, dx);
           });
  return out;
}

Tensor causal_attention(Graph& g, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                        double rope_theta) {
  Context& ctx = g.ctx();
  FSDP_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0, ShapeError,
             "attention: ", n_head, " query heads cannot share ", n_kv_head, " key/value heads");
  const int64_t heads = n_head + 2 * n_kv_head;
  FSDP_CHECK(qkv.dim() == 3 && qkv.size(2) % heads == 0, ShapeError, "attention: qkv ", qkv.str(),
             " must be (B, T, (H + 2 Hkv) D) with H = ", n_head, ", Hkv = ", n_kv_head);
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / heads;
  // Views of the fused projection: (B, T, H + 2 Hkv, D) -> q (B, T, H, D), k, v (B, T, Hkv, D).
  const Tensor fused = ops::contiguous(ctx, qkv).view(Shape{b, t, heads, d});
  Tensor q = fused.slice(2, 0, n_head);
  Tensor k = fused.slice(2, n_head, n_head + n_kv_head);
  const Tensor v = fused.slice(2, n_head + n_kv_head, heads);
  if (rope_theta > 0) {  // rotated copies, contiguous, each written in one pass over the view
    const Tensor q_rotated = ctx.empty(q.shape(), q.dtype());  // (B, T, H, D)
    const Tensor k_rotated = ctx.empty(k.shape(), k.dtype());  // (B, T, Hkv, D)
    ops::rope(ctx, q_rotated, q, rope_theta, false);
    ops::rope(ctx, k_rotated, k, rope_theta, false);
    q = q_rotated;
    k = k_rotated;
  }
  Tensor out = ctx.empty(Shape{b, t, n_head, d}, qkv.dtype());            // (B, T, H, D)
  const Tensor lse = ctx.empty(Shape{b, n_head, t}, stat_dtype(qkv.dtype()));  // (B, H, T)
  ops::attention_forward(ctx, out, lse, q, k, v);
  out = out.view(Shape{b, t, n_head * d});  // (B, T, H D)
  if (!g.should_record({&qkv}, false)) return out;

  out = Graph::track(out);
  g.record("attention", {out.autograd_meta()},
           [tqkv = Graph::target(qkv), om = out.autograd_meta(), out_data = out.view(out.shape()),
            lse, q, k, v, b, t, d, n_head, n_kv_head, heads, rope_theta](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             Context& ctx = g.ctx();
             const Tensor dout4 = ops::contiguous(ctx, dout).view(Shape{b, t, n_head, d});
             const Tensor out4 = out_data.view(Shape{b, t, n_head, d});
             overwrite_grad(g, tqkv, [&](const Tensor& dqkv) {
               // The kernel writes straight into the three slices of the fused gradient.
               const Tensor dfused = dqkv.view(Shape{b, t, heads, d});
               const Tensor dq = dfused.slice(2, 0, n_head);
               const Tensor dk = dfused.slice(2, n_head, n_head + n_kv_head);
               const Tensor dv = dfused.slice(2, n_head + n_kv_head, heads);
               ops::attention_backward(ctx, dq, dk, dv, dout4, out4, lse, q, k, v);
               if (rope_theta > 0) {  // gradients of the rotated q, k -> of the unrotated ones
                 ops::rope_apply(ctx, dq, rope_theta, true);
                 ops::rope_apply(ctx, dk, rope_theta, true);
               }
             });
           });
  return out;
}

Tensor cached_attention(Context& ctx, const Tensor& qkv, const Tensor& keys, const Tensor& values,
                        int64_t position, int64_t n_head, int64_t n_kv_head, double rope_theta) {
  const int64_t heads = n_head + 2 * n_kv_head;
  FSDP_CHECK(qkv.dim() == 3 && qkv.size(2) % heads == 0, ShapeError, "cached attention: qkv ",
             qkv.str(), " must be (B, T, (H + 2 Hkv) D) with H = ", n_head, ", Hkv = ", n_kv_head);
  const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / heads;
  FSDP_CHECK(keys.dim() == 4 && keys.size(0) == b && keys.size(2) == n_kv_head &&
                 keys.size(3) == d && values.shape() == keys.shape(),
             ShapeError, "cached attention: cache ", keys.str(), " / ", values.str(),
             " does not fit qkv ", qkv.str());
  FSDP_CHECK(position >= 0 && position + t <= keys.size(1), IndexError,
             "cached attention: positions [", position, ", ", position + t,
             ") do not fit a cache of ", keys.size(1));
  const Tensor fused = ops::contiguous(ctx, qkv).view(Shape{b, t, heads, d});
  Tensor q = fused.slice(2, 0, n_head);
  const Tensor new_keys = keys.slice(1, position, position + t);  // (B, Tn, Hkv, D) views
  ops::copy(ctx, new_keys, fused.slice(2, n_head, n_head + n_kv_head));
  ops::copy(ctx, values.slice(1, position, position + t),
            fused.slice(2, n_head + n_kv_head, heads));
  if (rope_theta > 0) {
    q = ops::contiguous(ctx, q);  // a copy: qkv is left as it is
    ops::rope_apply(ctx, q, rope_theta, false, position);
    ops::rope_apply(ctx, new_keys, rope_theta, false, position);  // rotated once, in the cache
  }
  Tensor out = ctx.empty(Shape{b, t, n_head, d}, qkv.dtype());  // (B, Tn, H, D)
  ops::attention_with_cache(ctx, out, q, keys.slice(1, 0, position + t),
                            values.slice(1, 0, position + t));
  return out.view(Shape{b, t, n_head * d});
}

}  // namespace fsdp::nn
