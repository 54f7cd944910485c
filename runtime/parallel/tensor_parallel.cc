#include "runtime/parallel/tensor_parallel.h"

#include "runtime/core/error.h"
#include "runtime/nn/layers.h"

namespace fsdp {

void CommunicatorTensorParallelGroup::all_reduce_sum(Context& ctx, const Tensor& t) {
  comm_.all_reduce(t, ReduceOp::Sum, ctx.stream());
}

void PlanningTensorParallelGroup::all_reduce_sum(Context&, const Tensor&) {
  FSDP_THROW(Error, "a planning tensor-parallel group cannot communicate: build the model's "
            "group over a communicator to run it");
}

namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Slices a Linear's weight (out, in) along `dim` by `ranges`, and its bias with the rows
// when column-parallel.
void slice_linear(nn::Linear& layer, int dim, const Ranges& ranges) {
  nn::Parameter& w = layer.weight();
  w.set_parallel_slice({w.shape(), dim, ranges});
  if (layer.bias() && dim == 0) layer.bias()->set_parallel_slice({layer.bias()->shape(), 0, ranges});
}

std::string line(const nn::Linear& layer, nn::ParallelStyle style) {
  return layer.name() + ": " + nn::parallel_style_name(style);
}

void split_attention(nn::CausalSelfAttention& a, nn::TensorParallelGroup& group,
                     std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const nn::AttentionConfig& c = a.config();
  const int64_t d = c.head_dim, h = c.n_head, hkv = c.n_kv_head;
  const auto q = nn::equal_part(0, h * d, r, tp, a.name() + " query heads");
  const auto k = nn::equal_part(h * d, (h + hkv) * d, r, tp, a.name() + " key heads");
  const auto v = nn::equal_part((h + hkv) * d, (h + 2 * hkv) * d, r, tp, a.name() + " value heads");
  slice_linear(a.qkv, 0, {q, k, v});
  a.qkv.set_parallel_style(nn::ParallelStyle::column, &group);
  slice_linear(a.proj, 1, {q});
  a.proj.set_parallel_style(nn::ParallelStyle::row, &group);
  a.set_local_heads(h / tp, hkv / tp);
  report.push_back(line(a.qkv, nn::ParallelStyle::column));
  report.push_back(line(a.proj, nn::ParallelStyle::row));
}

// fc (hidden rows, made of `parts` equal parts such as [gate | up]) column-parallel, proj
// (C, F) row-parallel over the same F/tp features.
void split_mlp(nn::Linear& fc, int parts, nn::Linear& proj, nn::TensorParallelGroup& group,
               std::vector<std::string>& report) {
  const int r = group.rank(), tp = group.size();
  const int64_t f = proj.weight().shape()[1];
  Ranges rows;
  for (int p = 0; p < parts; ++p)
    rows.push_back(nn::equal_part(p * f, (p + 1) * f, r, tp, fc.name() + " features"));
  slice_linear(fc, 0, rows);
  fc.set_parallel_style(nn::ParallelStyle::column, &group);
  slice_linear(proj, 1, {nn::equal_part(0, f, r, tp, proj.name() + " features")});
  proj.set_parallel_style(nn::ParallelStyle::row, &group);
  report.push_back(line(fc, nn::ParallelStyle::column));
  report.push_back(line(proj, nn::ParallelStyle::row));
}

}  // namespace

std::vector<std::string> apply_tensor_parallel(nn::Module& model, nn::TensorParallelGroup& group) {
  std::vector<std::string> report;
  if (group.size() == 1) return report;
  for (nn::Module* m : model.modules()) {
    if (auto* a = dynamic_cast<nn::CausalSelfAttention*>(m)) {
      split_attention(*a, group, report);
    } else if (auto* g = dynamic_cast<nn::GeluMLP*>(m)) {
      split_mlp(g->fc, 1, g->proj, group, report);
    } else if (auto* s = dynamic_cast<nn::SwiGLUMLP*>(m)) {
      split_mlp(s->gate_up, 2, s->proj, group, report);
    }
  }
  return report;
}

}  // namespace fsdp
