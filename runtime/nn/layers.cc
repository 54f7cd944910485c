#include "runtime/nn/layers.h"

#include "runtime/nn/context_parallel.h"
#include "runtime/nn/functional.h"

namespace fsdp::nn {

// ---------------------------------------------------------------- Linear

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, InitRule weight_init,
               ops::Epilogue epilogue)
    : epilogue_(epilogue) {
  weight_ = &add_parameter("weight", Shape{out_features, in_features}, weight_init, true);
  if (bias) bias_ = &add_parameter("bias", Shape{out_features}, InitRule::zeros(), false);
}

Tensor Linear::compute(Graph& g, const Tensor& x) {
  // A column-parallel layer exchanges its input itself (overlapping the backward's
  // exchanges with its products); a row-parallel one sums its output after.
  return parallel_output(g, linear(g, x, *weight_, fused_bias(), epilogue_, parallel_input()));
}

void Linear::set_parallel_style(ParallelStyle style, ParallelGroup* group, bool sequence) {
  FSDP_CHECK(style == ParallelStyle::replicated || group, ValueError, "Linear ", name(), ": a ",
             parallel_style_name(style), "-parallel layer needs a tensor-parallel group");
  FSDP_CHECK(style != ParallelStyle::row || epilogue_ == ops::Epilogue::None, ValueError, "Linear ",
             name(), ": a row-parallel layer cannot fuse an activation (it applies to the sum)");
  style_ = style;
  group_ = style == ParallelStyle::replicated ? nullptr : group;
  sequence_ = sequence && style != ParallelStyle::replicated;
}

Tensor Linear::parallel_output(Graph& g, const Tensor& y) {
  if (style_ != ParallelStyle::row) return y;
  const Tensor sum = tensor_parallel_leave(g, y, *group_, sequence_);
  return bias_ ? add_bias(g, sum, *bias_) : sum;
}

// ---------------------------------------------------------------- Embedding

Embedding::Embedding(int64_t rows, int64_t dim, InitRule init) {
  weight_ = &add_parameter("weight", Shape{rows, dim}, init, true);
}

Tensor Embedding::compute(Graph& g, const Tensor& idx) { return embedding(g, idx, *weight_); }

// ---------------------------------------------------------------- norms

LayerNorm::LayerNorm(int64_t dim, double eps) : eps_(eps) {
  weight_ = &add_parameter("weight", Shape{dim}, InitRule::ones(), false);
  bias_ = &add_parameter("bias", Shape{dim}, InitRule::zeros(), false);
}

Tensor LayerNorm::compute(Graph& g, const Tensor& x) {
  return layer_norm(g, x, *weight_, *bias_, eps_);
}

AddNorm LayerNorm::add_and_norm(Graph& g, const Tensor& x, const Tensor& residual) {
  FSDP_CHECK(!recompute(), ConfigError, "LayerNorm ", name(),
             ": add_and_norm cannot recompute the norm alone (recompute the enclosing block)");
  AddNorm r;
  run_forward(g, [&] {
    r = add_layer_norm(g, x, residual, *weight_, *bias_, eps_);
    return r.out;
  });
  return r;
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) {
  weight_ = &add_parameter("weight", Shape{dim}, InitRule::ones(), false);
}

Tensor RMSNorm::compute(Graph& g, const Tensor& x) { return rms_norm(g, x, *weight_, eps_); }

AddNorm RMSNorm::add_and_norm(Graph& g, const Tensor& x, const Tensor& residual) {
  FSDP_CHECK(!recompute(), ConfigError, "RMSNorm ", name(),
             ": add_and_norm cannot recompute the norm alone (recompute the enclosing block)");
  AddNorm r;
  run_forward(g, [&] {
    r = add_rms_norm(g, x, residual, *weight_, eps_);
    return r.out;
  });
  return r;
}

// ---------------------------------------------------------------- MLPs

GeluMLP::GeluMLP(int64_t dim, int64_t hidden, bool bias, InitRule init, InitRule proj_init)
    : fc(dim, hidden, bias, init, ops::Epilogue::Gelu), proj(hidden, dim, bias, proj_init) {
  add_module("fc", fc);
  add_module("proj", proj);
}

Tensor GeluMLP::compute(Graph& g, const Tensor& x) {
  // (..., C) -> (..., F) -> (..., C); under tensor parallelism F is this rank's slice.
  const Tensor y = mlp(g, x, fc.weight(), fc.fused_bias(), proj.weight(), proj.fused_bias(),
                       MlpActivation::Gelu, recompute_activation, fc.parallel_input());
  return proj.parallel_output(g, y);
}

SwiGLUMLP::SwiGLUMLP(int64_t dim, int64_t hidden, bool bias, InitRule init, InitRule proj_init)
    : gate_up(dim, 2 * hidden, bias, init), proj(hidden, dim, bias, proj_init) {
  add_module("gate_up", gate_up);
  add_module("proj", proj);
}

Tensor SwiGLUMLP::compute(Graph& g, const Tensor& x) {
  // (..., C) -> (..., 2F) -> (..., F) -> (..., C); under tensor parallelism F is this
  // rank's slice (its rows of gate and of up).
  const Tensor y = mlp(g, x, gate_up.weight(), gate_up.fused_bias(), proj.weight(),
                       proj.fused_bias(), MlpActivation::SwiGLU, recompute_activation,
                       gate_up.parallel_input());
  return proj.parallel_output(g, y);
}

// ---------------------------------------------------------------- attention

namespace {

AttentionConfig resolved(AttentionConfig c) {
  FSDP_CHECK(c.dim > 0 && c.n_head > 0, ShapeError, "attention: dim ", c.dim, " and heads ",
             c.n_head, " must be positive");
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  if (c.head_dim == 0) {
    FSDP_CHECK(c.dim % c.n_head == 0, ShapeError, "attention: dim ", c.dim,
               " is not divisible by ", c.n_head, " heads");
    c.head_dim = c.dim / c.n_head;
  }
  FSDP_CHECK(c.n_head % c.n_kv_head == 0, ShapeError, "attention: ", c.n_head,
             " query heads are not a multiple of ", c.n_kv_head, " key/value heads");
  return c;
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const AttentionConfig& config, InitRule init,
                                         InitRule proj_init)
    : qkv(config.dim,
          (resolved(config).n_head + 2 * resolved(config).n_kv_head) * resolved(config).head_dim,
          config.bias, init),
      proj(resolved(config).n_head * resolved(config).head_dim, config.dim, config.bias,
           proj_init),
      config_(resolved(config)) {
  add_module("qkv", qkv);
  add_module("proj", proj);
}

int64_t CausalSelfAttention::heads_in_range(size_t i, int64_t whole) {
  const std::optional<ParallelSlice>& slice = qkv.weight().parallel_slice();
  if (!slice) return whole;
  FSDP_CHECK(slice->dim == 0 && slice->ranges.size() == 3, ShapeError, "attention ", name(),
             ": qkv's slice ", slice->str(), " is not three row ranges [q | k | v]");
  const int64_t rows = slice->ranges[i].second - slice->ranges[i].first;
  FSDP_CHECK(rows % config_.head_dim == 0, ShapeError, "attention ", name(), ": qkv's slice ",
             slice->str(), " does not hold whole heads of ", config_.head_dim);
  return rows / config_.head_dim;
}

int64_t CausalSelfAttention::local_heads() { return heads_in_range(0, config_.n_head); }
int64_t CausalSelfAttention::local_kv_heads() { return heads_in_range(1, config_.n_kv_head); }

void CausalSelfAttention::set_context_parallel(const ContextParallelLayout& layout,
                                               ParallelGroup* group,
                                               ContextParallelComm comm) {
  cp_layout_ = layout;
  cp_group_ = group;
  cp_comm_ = comm;
}

Tensor CausalSelfAttention::compute(Graph& g, const Tensor& x) {
  // H and Hkv are this rank's heads under tensor parallelism (all of them otherwise); T is
  // this rank's part of the sequence under context parallelism.
  const int64_t h = local_heads(), hkv = local_kv_heads();
  const Tensor fused = qkv(g, x);  // (B, T, (H + 2 Hkv) D)
  const Tensor y = cp_group_ ? context_parallel_attention(g, fused, h, hkv, config_.rope_theta,
                                                          cp_layout_, *cp_group_, cp_comm_)
                             : causal_attention(g, fused, h, hkv, config_.rope_theta);  // (B, T, H D)
  return proj(g, y);  // (B, T, C)
}

Tensor CausalSelfAttention::decode(Graph& g, const Tensor& x, AttentionCache& cache,
                                   int64_t position) {
  FSDP_CHECK(!g.grad_enabled(), ValueError,
             "attention decode is for generation: run it under autograd::NoGradGuard");
  return run_forward(g, [&] {
    const Tensor fused = qkv(g, x);  // (B, Tn, (H + 2 Hkv) D)
    const Tensor y = cached_attention(g.ctx(), fused, cache.keys, cache.values, position,
                                      local_heads(), local_kv_heads(),
                                      config_.rope_theta);  // (B, Tn, H D)
    return proj(g, y);  // (B, Tn, C)
  });
}

}  // namespace fsdp::nn
