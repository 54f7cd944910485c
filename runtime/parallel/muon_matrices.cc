#include "runtime/parallel/muon_matrices.h"

#include "kernels/ops.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"

namespace fsdp {
namespace {

// A tensor-parallel slice made whole: every rank writes the ranges it owns into a zeroed whole
// tensor and the group sums them (each element comes from one rank: exact). One strided copy
// per range of the slice (a row-parallel weight's columns, each of q, k and v's rows).
class TensorParallelWhole : public WholeMatrix {
 public:
  TensorParallelWhole(nn::ParallelSlice slice, Communicator& group)
      : slice_(std::move(slice)), group_(group) {}
  Shape whole_shape() const override { return slice_.full_shape; }
  void assemble(Context& ctx, CollectiveCalls& calls, const Tensor& local,
                const Tensor& whole) override {
    ops::fill(ctx, whole, 0.0);
    for_each_range([&](const Tensor& part_of_local, const Tensor& part_of_whole, int replicas) {
      // A range held by several ranks (a shared key/value head) comes from the first of them.
      if (group_.rank() % replicas == 0) ops::copy(ctx, part_of_whole, part_of_local);
    }, local, whole);
    if (calls.communicates(&group_)) calls.all_reduce(group_, whole, ReduceOp::Sum, ctx.stream(), 1.0);
  }
  void slice(Context& ctx, const Tensor& whole, const Tensor& local) override {
    for_each_range([&](const Tensor& part_of_local, const Tensor& part_of_whole, int) {
      ops::copy(ctx, part_of_local, part_of_whole);
    }, local, whole);
  }

 private:
  // f(local's part, whole's part, replicas) for each range of the slice, as views.
  template <typename F>
  void for_each_range(F&& f, const Tensor& local, const Tensor& whole) const {
    int64_t at = 0;  // along the slice's dim, in the local tensor
    for (size_t i = 0; i < slice_.ranges.size(); ++i) {
      const auto [b, e] = slice_.ranges[i];
      f(local.narrow(slice_.dim, at, e - b), whole.narrow(slice_.dim, b, e - b), slice_.replicas_of(i));
      at += e - b;
    }
  }

  nn::ParallelSlice slice_;
  Communicator& group_;
};

}  // namespace

// f(weight, row_parts, batched) for every parameter Muon takes, in the table's order.
template <typename F>
void for_each_muon_param(nn::Module& model, const nn::LayerTable& table, bool split_qkv, F&& f) {
  using S = nn::LayerStyle;
  for (const nn::StyledLayer& layer : table.resolve(model)) {
    const nn::LayerRow& row = *layer.row;
    if (row.style == S::column_heads) {
      nn::Linear& qkv = nn::styled_as<nn::Linear>(layer, "Linear");
      const nn::AttentionHeads& h = row.heads;
      std::vector<int64_t> parts;
      if (split_qkv) parts = {h.n_head * h.head_dim, h.n_kv_head * h.head_dim, h.n_kv_head * h.head_dim};
      f(qkv.weight(), parts, false);
    } else if (row.style == S::column || row.style == S::row) {
      nn::Linear& linear = nn::styled_as<nn::Linear>(layer, "Linear");
      const int64_t rows = linear.weight().full_shape()[0];
      std::vector<int64_t> parts;
      if (row.style == S::column && row.parts > 1) parts.assign(size_t(row.parts), rows / row.parts);
      f(linear.weight(), parts, false);
    } else if (row.style == S::experts) {
      nn::MoELayer& moe = nn::styled_as<nn::MoELayer>(layer, "MoELayer");
      nn::Parameter& fc = moe.experts.fc();
      std::vector<int64_t> parts;
      if (fc.local_name() == "gate_up") parts.assign(2, fc.shape()[1] / 2);
      f(fc, parts, true);
      f(moe.experts.proj(), std::vector<int64_t>{}, true);
    }
  }
}

MuonMatrices::MuonMatrices(nn::Module& model, const nn::LayerTable& table, Communicator* tensor_parallel,
                           bool split_qkv) {
  for_each_muon_param(model, table, split_qkv,
                      [&](nn::Parameter& weight, std::vector<int64_t> parts, bool batched) {
                        add(weight, std::move(parts), batched, tensor_parallel);
                      });
}

std::vector<std::string> muon_param_names(nn::Module& model, const nn::LayerTable& table) {
  std::vector<std::string> names;
  for_each_muon_param(model, table, true, [&](nn::Parameter& weight, const std::vector<int64_t>&, bool) {
    names.push_back(weight.name());
  });
  return names;
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

std::unique_ptr<MuonOrthogonalizer> muon_orthogonalizer(Context& ctx, ShardedModel& sharded,
                                                        const std::vector<MuonParamSpec>& specs,
                                                        const OptimizerConfig& config) {
  const ShardingPlan& plan = sharded.plan();
  std::vector<MuonUnitGeometry> geometry;
  for (int u = 0; u < sharded.num_units(); ++u) {
    const UnitPlan& p = plan.units()[size_t(u)];
    MuonUnitGeometry g;
    g.name = p.name;
    for (const ParamPlacement& param : p.params) g.params.push_back({param.name, param.shape, param.offset});
    g.padded_numel = p.padded_numel;
    g.shard_numel = p.shard_numel;
    if (p.dp_size > 1) {
      g.shard_rank = sharded.unit_groups(u).shard_rank();
      g.shard_size = sharded.unit_groups(u).shard_size();
      FSDP_ASSERT(g.shard_size == p.dp_size, "muon: unit ", p.name, " is sharded over ", p.dp_size,
                  " ranks but its group has ", g.shard_size);
    }
    geometry.push_back(std::move(g));
  }
  std::vector<MuonUnit> units = muon_units(geometry, specs, config.muon.newton_schulz.steps);
  std::vector<MuonGroup> groups;
  for (const MuonUnit& mu : units) {
    const DataParallelGroups& g = sharded.unit_groups(mu.unit);
    groups.push_back(mu.geometry.shard_size > 1 ? MuonGroup{g.shard_gather, g.shard_reduce} : MuonGroup{});
  }
  const DType dtype = config.moments_dtype == DType::f64 ? DType::f64 : DType::f32;
  return std::make_unique<MuonOrthogonalizer>(ctx, sharded.collective_calls(), std::move(units),
                                              std::move(groups), dtype, config.muon);
}

}  // namespace fsdp
