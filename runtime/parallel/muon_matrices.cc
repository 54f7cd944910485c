#include "runtime/parallel/muon_matrices.h"

#include "kernels/ops.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"

namespace fsdp {
namespace {

// A tensor-parallel slice made whole: every rank writes the runs it owns into a zeroed whole
// tensor and the group sums them (each element comes from one rank: exact).
class TensorParallelWhole : public WholeMatrix {
 public:
  TensorParallelWhole(nn::ParallelSlice slice, Communicator& group)
      : slice_(std::move(slice)), group_(group) {}
  Shape whole_shape() const override { return slice_.full_shape; }
  void assemble(Context& ctx, const Tensor& local, const Tensor& whole) override {
    const Tensor in = local.flatten(), out = whole.flatten();
    ops::fill(ctx, out, 0.0);
    for (const nn::ParallelSlice::Run& r : slice_.owned_runs(0, in.numel(), group_.rank()))
      ops::copy(ctx, out.narrow(0, r.full, r.numel), in.narrow(0, r.local, r.numel));
    group_.all_reduce(out.data_ptr(), out.data_ptr(), size_t(out.numel()), out.dtype(), ReduceOp::Sum,
                      ctx.stream())
        .wait(ctx.stream());
  }
  void slice(Context& ctx, const Tensor& whole, const Tensor& local) override {
    const Tensor in = whole.flatten(), out = local.flatten();
    for (const nn::ParallelSlice::Run& r : slice_.runs(0, out.numel()))
      ops::copy(ctx, out.narrow(0, r.local, r.numel), in.narrow(0, r.full, r.numel));
  }

 private:
  nn::ParallelSlice slice_;
  Communicator& group_;
};

}  // namespace

MuonMatrices::MuonMatrices(nn::Module& model, const nn::LayerTable& table, Communicator* tensor_parallel,
                           bool split_qkv) {
  using S = nn::LayerStyle;
  for (const nn::StyledLayer& layer : table.resolve(model)) {
    const nn::LayerRow& row = *layer.row;
    if (row.style == S::column_heads) {
      nn::Linear& qkv = nn::styled_as<nn::Linear>(layer, "Linear");
      const nn::AttentionHeads& h = row.heads;
      std::vector<int64_t> parts;
      if (split_qkv) parts = {h.n_head * h.head_dim, h.n_kv_head * h.head_dim, h.n_kv_head * h.head_dim};
      add(qkv.weight(), parts, false, tensor_parallel);
    } else if (row.style == S::column || row.style == S::row) {
      nn::Linear& linear = nn::styled_as<nn::Linear>(layer, "Linear");
      const int64_t rows = linear.weight().full_shape()[0];
      std::vector<int64_t> parts;
      if (row.style == S::column && row.parts > 1) parts.assign(size_t(row.parts), rows / row.parts);
      add(linear.weight(), parts, false, tensor_parallel);
    } else if (row.style == S::experts) {
      nn::MoELayer& moe = nn::styled_as<nn::MoELayer>(layer, "MoELayer");
      nn::Parameter& fc = moe.experts.fc();
      std::vector<int64_t> parts;
      if (fc.local_name() == "gate_up") parts.assign(2, fc.shape()[1] / 2);
      add(fc, parts, true, nullptr);
      add(moe.experts.proj(), {}, true, nullptr);
    }
  }
}

void MuonMatrices::add(nn::Parameter& weight, std::vector<int64_t> row_parts, bool batched,
                       Communicator* tensor_parallel) {
  MuonParamSpec spec;
  spec.name = weight.name();
  spec.row_parts = std::move(row_parts);
  spec.batched = batched;
  const auto& slice = weight.parallel_slice();
  if (slice && !batched) {
    FSDP_CHECK(tensor_parallel != nullptr, ConfigError, "muon: ", weight.name(),
               " is sliced but no tensor-parallel group was given");
    wholes_.push_back(std::make_unique<TensorParallelWhole>(*slice, *tensor_parallel));
    spec.whole = wholes_.back().get();
  }
  specs_.push_back(std::move(spec));
}

std::unique_ptr<MuonOrthogonalizer> muon_orthogonalizer(Context& ctx, const ShardedModel& sharded,
                                                        const std::vector<MuonParamSpec>& specs,
                                                        const OptimizerConfig& config) {
  const ShardingPlan& plan = sharded.plan();
  std::vector<MuonGroup> groups;
  std::vector<int> sizes;
  for (int u = 0; u < sharded.num_units(); ++u) {
    const DataParallelGroups& g = sharded.unit_groups(u);
    MuonGroup mg;
    if (plan.units()[size_t(u)].dp_size > 1) {
      mg = {g.shard_gather, g.shard_reduce, g.shard_rank(), g.shard_size()};
      FSDP_ASSERT(mg.size == plan.units()[size_t(u)].dp_size, "muon: unit ", u, " is sharded over ",
                  plan.units()[size_t(u)].dp_size, " ranks but its group has ", mg.size);
    }
    groups.push_back(mg);
    sizes.push_back(mg.size);
  }
  std::vector<MuonUnit> units = muon_units(plan, specs, sizes, config.muon.newton_schulz.steps);
  const DType dtype = config.moments_dtype == DType::f64 ? DType::f64 : DType::f32;
  return std::make_unique<MuonOrthogonalizer>(ctx, plan, std::move(units), std::move(groups), dtype,
                                              config.muon);
}

}  // namespace fsdp
